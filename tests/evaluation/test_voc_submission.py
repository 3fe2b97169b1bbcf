"""tools/test.py --split test --format-only --out DIR: masks of a split without ground truth in the VOC devkit's
results layout, one archive for the server, the same bytes from one process and from two torchrun ranks."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.evaluation.test_sharded_eval import files, torchrun
from tools import test as test_cli
from wsss.utils.fileio import save_image

pytestmark = pytest.mark.usefixtures("one_thread")

LAYOUT = "results/VOC2012/Segmentation/comp6_test_cls"
SIZES = {"t1": (50, 30), "t2": (33, 47)}  # width, height


def devkit_colormap() -> np.ndarray:
    """``VOClabelcolormap(256)`` of the VOC devkit (VOCcode/VOClabelcolormap.m), written out here: bit k of the index
    goes to bit 7 - k // 3 of red, green or blue by k % 3."""
    cmap = np.zeros((256, 3), dtype=np.uint8)
    for i in range(256):
        for k in range(8 * 3):
            if i >> k & 1:
                cmap[i, k % 3] |= 1 << (7 - k // 3)
    return cmap


@pytest.fixture
def test_split(tiny_voc: Path) -> list[str]:
    """A test split of two images without ground truth in the tiny set."""
    rng = np.random.default_rng(1)
    for image_id, (w, h) in SIZES.items():
        save_image(tiny_voc / "JPEGImages" / f"{image_id}.jpg", rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
    (tiny_voc / "ImageSets" / "Segmentation" / "test.txt").write_text("t2\nt1\n")
    return sorted(SIZES)


def args(cfg_file: Path, ckpt: Path, folder: Path) -> list[str]:
    return [str(cfg_file), str(ckpt), "--split", "test", "--format-only", "--out", str(folder / "out"),
            "--work-dir", str(folder / "work"), "--device", "cpu"]  # fmt: skip


def test_format_only_writes_the_devkit_layout_and_one_archive(checkpoint, test_split, tiny_voc, tmp_path, capsys):
    cfg_file, ckpt = checkpoint
    assert not any((tiny_voc / "SegmentationClass").glob("t*.png"))  # no ground truth to score
    assert test_cli.main(args(cfg_file, ckpt, tmp_path)) == 0
    printed = capsys.readouterr().out
    out = tmp_path / "out"
    archive = out / "results.tar.gz"
    assert ("protocol: checkpoint iter_0.pth (step 0); split test, 2 of 2 images: all of the split, not the val set, "
            "not scored (--format-only); scales (1), flip off") in printed  # fmt: skip
    assert f"upload {archive} (2 masks under {LAYOUT}/)" in printed and "http://host.robots.ox.ac.uk:8080/" in printed
    assert "comp6" in printed and "not VOC's 21" in printed  # the tiny classes are not VOC's

    with tarfile.open(archive, "r:gz") as tar:
        members = tar.getmembers()
        names = [m.name for m in members]
        assert names == ["results", "results/VOC2012", "results/VOC2012/Segmentation", LAYOUT,
                         f"{LAYOUT}/t1.png", f"{LAYOUT}/t2.png"]  # fmt: skip
        assert [m.isdir() for m in members] == [True] * 4 + [False] * 2
        assert {(m.mtime, m.uid, m.gid) for m in members} == {(0, 0, 0)}
        packed = {m.name: tar.extractfile(m).read() for m in members if m.isfile()}
    assert archive.read_bytes()[4:8] == b"\0\0\0\0"  # gzip header without a time
    for image_id, (w, h) in SIZES.items():
        data = (out / LAYOUT / f"{image_id}.png").read_bytes()
        assert packed[f"{LAYOUT}/{image_id}.png"] == data
        with Image.open(out / LAYOUT / f"{image_id}.png") as png:
            assert png.mode == "P" and png.size == (w, h)  # an index PNG at the image's size
            palette = np.asarray(png.getpalette(), dtype=np.uint8).reshape(-1, 3)
            values = set(np.unique(np.asarray(png)).tolist())
        np.testing.assert_array_equal(palette, devkit_colormap())
        assert values <= {0, 1, 2}
    assert devkit_colormap()[[1, 15, 20, 255]].tolist() == [[128, 0, 0], [192, 128, 128], [0, 64, 128], [224, 224, 192]]

    run = tmp_path / "work" / "test_iter_0_test"
    record = json.loads((run / "submission.json").read_text())
    assert record["archive"] == str(archive) and record["protocol"]["scored"] is False
    assert sorted(p.name for p in run.iterdir()) == ["submission.json"]  # issue 38, 5.6: no second copy of the masks
    assert sorted(p.name for p in (out / "masks").iterdir()) == ["t1.png", "t2.png"]  # --out's masks, as ever
    for image_id in SIZES:
        assert (out / "masks" / f"{image_id}.png").read_bytes() == (out / LAYOUT / f"{image_id}.png").read_bytes()


def test_format_only_refuses_without_out_or_with_an_image_missing(checkpoint, test_split, tiny_voc, tmp_path, capsys):
    cfg_file, ckpt = checkpoint
    no_out = [a for a in args(cfg_file, ckpt, tmp_path) if a != str(tmp_path / "out") and a != "--out"]
    assert test_cli.main(no_out) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "give --out" in err
    (tiny_voc / "ImageSets" / "Segmentation" / "test.txt").write_text("t1\nt3\nt2\n")  # t3 has no image
    assert test_cli.main(args(cfg_file, ckpt, tmp_path)) == 2
    err = capsys.readouterr().err.splitlines()[-1]  # after the progress bar
    assert err.startswith("error: ") and "1 images of the split have no mask" in err
    assert "(first: t3)" in err and not (tmp_path / "out" / "results.tar.gz").exists()


@pytest.mark.slow
def test_two_ranks_write_the_same_archive_as_one_process(checkpoint, test_split, tmp_path, capsys):
    """Under torchrun --launcher pytorch (2 CPU ranks) the archive equals the 1-process one byte for byte."""
    cfg_file, ckpt = checkpoint
    assert test_cli.main(args(cfg_file, ckpt, tmp_path / "single")) == 0
    capsys.readouterr()
    proc = torchrun(2, "tools/test.py", *args(cfg_file, ckpt, tmp_path / "sharded"), "--launcher", "pytorch")
    assert proc.stdout.count("upload ") == 1  # rank 0 alone prints
    single, sharded = files(tmp_path / "single" / "out"), files(tmp_path / "sharded" / "out")
    submitted = [f"{LAYOUT}/t1.png", f"{LAYOUT}/t2.png", "masks/t1.png", "masks/t2.png", "results.tar.gz"]
    assert sorted(k for k in single if k.startswith(("results", "masks/"))) == sorted(submitted)
    assert {k: sharded[k] for k in submitted} == {k: single[k] for k in submitted}
