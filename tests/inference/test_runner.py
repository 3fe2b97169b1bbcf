"""Inference end to end: batching, the dense CRF pool, path safety and tools/infer.py on a trained tiny model."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import weakref
from pathlib import Path, PurePosixPath

import numpy as np
import pytest
import torch
from PIL import Image

from tools import eval as eval_cli
from tools import infer as infer_cli
from wsss.config import InferConfig
from wsss.data.toy.render import TOY_CLASSES
from wsss.inference.folder import batching, loop, runner
from wsss.inference.folder.runner import InferenceOptions, run_inference
from wsss.inference.folder.sources import list_split
from wsss.utils import fileio, startup
from wsss.utils.fileio import read_mask, temporary_prefix

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def trained(toy_checkpoint):
    """(toy root, checkpoint of a tiny ViT trained on it): see tests/inference/conftest.py."""
    return toy_checkpoint


def make_input(root: Path, folder: Path) -> dict[str, str]:
    """A nested input folder (copies of toy images), a corrupt file and a text file: {rel: toy id}."""
    layout = {"a/x.jpg": "val_00000", "a/b/y.jpg": "val_00001", "z.jpg": "train_00000"}
    for rel, image_id in layout.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(root / "JPEGImages" / f"{image_id}.jpg", folder / rel)
    (folder / "bad.jpg").write_bytes(b"\xff\xd8\xff not really a jpeg")
    (folder / "notes.txt").write_text("not an image\n")
    return layout


@pytest.mark.slow
def test_cli_end_to_end(trained, tmp_path, capsys):
    root, ckpt = trained
    inp, out, gt = tmp_path / "in", tmp_path / "out", tmp_path / "gt"
    layout = make_input(root, inp)
    args = [str(ckpt), str(inp), str(out), "--scales", "1.0", "0.75", "--flip", "--crf", "--overlay", "--cams",
            "--logits", "--gallery", "--no-progress", "--crf-workers", "2"]  # fmt: skip
    assert infer_cli.main(args) == 0
    printed = capsys.readouterr().out
    assert "done 3 images" in printed and "images/s" in printed
    assert "bad.jpg: not a readable image (cannot identify image file" in printed
    assert "notes.txt: not an image file" in printed

    num_classes = len(TOY_CLASSES)
    for rel, image_id in layout.items():
        stem = rel[: -len(".jpg")]
        image = Image.open(inp / rel)
        with Image.open(out / "masks" / f"{stem}.png") as m:
            assert m.mode == "P" and m.size == image.size
        mask = read_mask(out / "masks" / f"{stem}.png")
        assert mask.max() < num_classes
        for kind in ("overlays", "cams", "thumbs"):
            assert (out / kind / f"{stem}.jpg").is_file()
        logits = np.load(out / "logits" / f"{stem}.npy")
        w, h = image.size
        assert logits.dtype == np.float16 and logits.shape == (num_classes, -(-h // 4), -(-w // 4))
        (gt / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(root / "SegmentationClass" / f"{image_id}.png", gt / f"{stem}.png")
    assert not (out / "masks" / "bad.png").exists()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["done"] == 3 and {s["path"] for s in summary["skipped"]} == {"bad.jpg", "notes.txt"}
    labels = json.loads((out / "image_labels.json").read_text())
    assert set(labels["images"]) == set(layout) and any(v["present"] for v in labels["images"].values())
    for rel in layout:  # present: the classifier's classes the mask shows (mask_classes present: all it shows)
        shown = np.unique(read_mask(out / "masks" / f"{rel[: -len('.jpg')]}.png")).tolist()
        assert labels["images"][rel]["present"] == [TOY_CLASSES[k] for k in shown if k], rel
    page = (out / "index.html").read_text()
    assert 'src="overlays/a/b/y.jpg"' in page and 'href="cams/z.jpg"' in page and str(tmp_path) not in page

    # the masks score with tools/eval.py against the mirrored ground truth
    assert eval_cli.main([str(out / "masks"), str(gt), "--classes", str(root / "classes.txt")]) == 0
    assert "mIoU" in capsys.readouterr().out

    # a re-run skips every image (outputs untouched); --overwrite redoes them
    stats = {p: p.stat() for p in out.rglob("*") if p.is_file() and p.parent != out}
    assert infer_cli.main(args) == 0
    rerun = json.loads((out / "summary.json").read_text())
    assert rerun["done"] == 0 and rerun["existing"] == 3
    for p, st in stats.items():
        assert (p.stat().st_mtime_ns, p.stat().st_ino) == (st.st_mtime_ns, st.st_ino), p
    assert infer_cli.main([*args, "--overwrite"]) == 0
    assert json.loads((out / "summary.json").read_text())["done"] == 3
    mask_file = out / "masks" / "z.png"
    assert mask_file.stat().st_ino != stats[mask_file].st_ino  # rewritten (atomically, a new file)


def test_the_crf_processes_take_their_cpus_from_the_model(trained, tmp_path, monkeypatch):
    """On the CPU the checkpoint's CRF workers, known once it is read, count with the decoding processes in the model's
    threads, unless the user chose them (tools/infer.py passes --threads or OMP_NUM_THREADS)."""
    root, ckpt = trained
    inp = tmp_path / "in"
    inp.mkdir()
    shutil.copy(root / "JPEGImages" / "train_00002.jpg", inp / "a.jpg")
    calls = []
    monkeypatch.setattr(runner, "threads_beside", lambda workers, chosen: calls.append((workers, chosen)))
    for name, threads, crf in (("default", None, True), ("chosen", 3, True), ("plain", None, False)):
        opts = InferenceOptions(crf=crf, crf_workers=2, num_workers=1, threads=threads, progress=False)
        assert run_inference(ckpt, inp, tmp_path / name, options=opts, device="cpu").done == 1
    assert calls == [(3, None), (3, 3)]


def test_the_batchs_logits_are_let_go_before_its_crf_runs(trained, tmp_path, monkeypatch):
    """A batch's full-size TTA logits (B x C x H x W floats) are not held while its CRF runs in the loop's own call
    (on a GPU, or with --crf-workers 0): the CRF's memory budget is then what the call adds to the probabilities."""
    from wsss.inference import crf as crf_module
    from wsss.inference import predictor

    root, ckpt = trained
    inp = tmp_path / "in"
    inp.mkdir()
    for i in range(2):
        Image.open(root / "JPEGImages" / f"train_{i:05d}.jpg").resize((64, 48)).save(inp / f"{i}.png")
    logits, alive = [], []
    real_tta, real_crf = predictor.tta_forward, crf_module.crf_labels

    def tta(*args, **kwargs):
        out = real_tta(*args, **kwargs)
        logits.append(weakref.ref(out.seg))
        return out

    def crf(*args, **kwargs):
        alive.append(sum(ref() is not None for ref in logits))
        return real_crf(*args, **kwargs)

    monkeypatch.setattr(predictor, "tta_forward", tta)
    monkeypatch.setattr(crf_module, "crf_labels", crf)
    opts = InferenceOptions(scales=(1.0,), flip=False, batch_size=2, crf=True, crf_workers=0, num_workers=0,
                            progress=False, cfg_options={"infer.crf.iterations": 1})  # fmt: skip
    assert run_inference(ckpt, inp, tmp_path / "out", options=opts).done == 2
    assert len(logits) == 1 and alive == [0, 0]


def test_the_batch_size_comes_from_the_config_within_its_pixel_budget(trained, tmp_path, monkeypatch):
    """Without ``batch_size`` the run takes ``infer.batch_size`` on a GPU (so ``tools/test.py`` batches there) and
    ``infer.cpu_batch_size`` on the CPU, and a batch never holds more than ``infer.batch_pixels`` pixels;
    ``batch_size`` (``--batch-size``) sets the image count on any device."""
    from wsss.inference import predictor

    infer = InferConfig(batch_size=5, cpu_batch_size=2)
    devices = ("cuda", "cuda:1", torch.device("cuda"), "cpu")
    assert [batching.default_batch_size(infer, device) for device in devices] == [5, 5, 5, 2]

    root, ckpt = trained
    inp = tmp_path / "in"
    inp.mkdir()
    toy = sorted((root / "JPEGImages").glob("*.jpg"))
    for i in range(7):
        Image.open(toy[i % len(toy)]).resize((40, 30)).save(inp / f"{i}.png")
    sizes, real = [], predictor.Segmenter.run_batch

    def run_batch(self, images, *args, **kwargs):
        sizes.append(len(images))
        return real(self, images, *args, **kwargs)

    monkeypatch.setattr(predictor.Segmenter, "run_batch", run_batch)
    base = {"scales": (1.0,), "flip": False, "num_workers": 0, "progress": False, "overwrite": True}
    for batch_size, cfg_options, expected in (
        (None, {"infer.cpu_batch_size": 3}, [3, 3, 1]),
        (None, {"infer.cpu_batch_size": 3, "infer.batch_pixels": 2 * 40 * 30}, [2, 2, 2, 1]),
        (None, {"infer.cpu_batch_size": 3, "infer.batch_pixels": 2 * 40 * 30 - 1}, [1] * 7),
        (4, {"infer.cpu_batch_size": 3}, [4, 3]),
        (None, {"infer.batch_size": 3}, [1] * 7),  # the default on the CPU: one at a time, whatever the GPU's
    ):
        sizes.clear()
        opts = InferenceOptions(batch_size=batch_size, cfg_options=cfg_options, **base)
        assert run_inference(ckpt, inp, tmp_path / "out", options=opts).done == 7
        assert sizes == expected, (batch_size, cfg_options)
    with pytest.raises(ValueError, match=r"^--batch-size: config key 'infer.batch_size': must be in \[1, 1024\]"):
        run_inference(ckpt, inp, tmp_path / "out", options=InferenceOptions(batch_size=2000, **base))


@pytest.mark.slow
def test_batching_and_crf_change_nothing_unexpected(trained, tmp_path, monkeypatch):
    """Batch size 3 on same-size and odd-size images gives the logits of batch size 1 and the same masks, byte for
    byte; CRF changes masks only. One torch thread throughout: the CRF's worker would otherwise leave the model the
    other cores (``threads_beside``), 15 on a 16-core machine, whose rounding moved 4 of 14,000 logits (the H200
    machine, 2026-11-28; here too, with 16 cores faked)."""
    monkeypatch.setattr(startup, "available_cpus", lambda: 16)
    root, ckpt = trained
    inp = tmp_path / "in"
    inp.mkdir()
    for i in range(3):  # three different images of one size (lossless), two of other sizes
        Image.open(root / "JPEGImages" / f"train_{i:05d}.jpg").resize((200, 160)).save(inp / f"same{i}.png")
    shutil.copy(root / "JPEGImages" / "train_00002.jpg", inp / "other1.jpg")
    shutil.copy(root / "JPEGImages" / "train_00003.jpg", inp / "other2.jpg")
    runs = {}
    for name, batch, crf in (("b1", 1, False), ("b3", 3, False), ("crf", 3, True)):
        opts = InferenceOptions(scales=(1.0, 0.75), flip=True, logits=True, batch_size=batch, crf=crf,
                                crf_workers=1, progress=False, num_workers=0, threads=1)  # fmt: skip
        summary = run_inference(ckpt, inp, tmp_path / name, options=opts)
        assert summary.done == 5 and not summary.skipped
        runs[name] = tmp_path / name
    for rel in ("same0", "same1", "same2", "other1", "other2"):
        a = np.load(runs["b1"] / "logits" / f"{rel}.npy").astype(np.float32)
        b = np.load(runs["b3"] / "logits" / f"{rel}.npy").astype(np.float32)
        np.testing.assert_allclose(a, b, atol=2e-2, rtol=1e-2)
        # same batching with and without CRF: the CRF touches the masks, never the logits
        np.testing.assert_array_equal(b, np.load(runs["crf"] / "logits" / f"{rel}.npy").astype(np.float32))
        plain = read_mask(runs["b1"] / "masks" / f"{rel}.png")
        np.testing.assert_array_equal(read_mask(runs["b3"] / "masks" / f"{rel}.png"), plain)  # byte for byte
        assert plain.shape == read_mask(runs["crf"] / "masks" / f"{rel}.png").shape
    changed = sum((read_mask(runs["b1"] / "masks" / f"{r}.png") != read_mask(runs["crf"] / "masks" / f"{r}.png")).any()
                  for r in ("same0", "other1", "other2"))  # fmt: skip
    assert changed >= 1  # the CRF does change the masks


def test_paths_cannot_escape(trained, tmp_path):
    root, ckpt = trained
    inp, out, outside = tmp_path / "in", tmp_path / "out", tmp_path / "outside"
    (inp / "sub").mkdir(parents=True)
    outside.mkdir()
    shutil.copy(root / "JPEGImages" / "val_00000.jpg", inp / "ok.jpg")
    shutil.copy(root / "JPEGImages" / "val_00001.jpg", inp / "sub" / "deep.jpg")
    shutil.copy(root / "JPEGImages" / "val_00001.jpg", outside / "secret.jpg")
    os.symlink(outside / "secret.jpg", inp / "link_out.jpg")
    os.symlink(inp / "ok.jpg", inp / "link_in.jpg")
    os.symlink(outside, inp / "linked_dir")  # a symlinked folder is not entered
    (out / "masks").mkdir(parents=True)
    os.symlink(outside, out / "masks" / "sub")  # an output folder pointing outside OUTPUT
    before = sorted(p.name for p in outside.iterdir())

    summary = run_inference(ckpt, inp, out, options=InferenceOptions(scales=(1.0,), flip=False, progress=False))
    reasons = {s.path: s.reason for s in summary.skipped}
    assert "resolves outside the input folder" in reasons["link_out.jpg"]
    assert "resolves outside the output folder" in reasons["sub/deep.jpg"]
    assert summary.done == 2 and (out / "masks" / "ok.png").is_file() and (out / "masks" / "link_in.png").is_file()
    assert sorted(p.name for p in outside.iterdir()) == before  # nothing written outside

    # the output folder inside the input folder is never read back as input
    nested = run_inference(ckpt, inp, inp / "pred", options=InferenceOptions(scales=(1.0,), flip=False, progress=False))
    again = run_inference(ckpt, inp, inp / "pred", options=InferenceOptions(scales=(1.0,), flip=False, progress=False))
    assert nested.done == 3 and again.done == 0 and again.existing == 3  # ok, link_in, sub/deep
    with pytest.raises(ValueError, match="must differ"):
        run_inference(ckpt, inp, inp)


def test_voc_root_with_split(trained, tmp_path, capsys):
    root, ckpt = trained
    split = tmp_path / "ids.txt"
    split.write_text("val_00000\n../../etc/x\n/etc/passwd\nmissing_id\nval_00001\n")
    sources, skipped = list_split(root, str(split))
    assert [s.rel for s in sources] == ["val_00000.jpg", "val_00001.jpg"]
    assert {s.path for s in skipped} == {"../../etc/x", "/etc/passwd", "missing_id"}
    out = tmp_path / "out"
    assert infer_cli.main([str(ckpt), str(root), str(out), "--split", str(split), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "../../etc/x: unsafe id" in printed and "missing_id: no image" in printed
    assert sorted(p.name for p in (out / "masks").iterdir()) == ["val_00000.png", "val_00001.png"]
    # a split name under ImageSets/Segmentation, and the default output folder INPUT_pred
    assert infer_cli.main([str(ckpt), str(root), "--split", "val", "--no-progress"]) == 0
    default = root.with_name(root.name + "_pred")
    assert sorted(p.name for p in (default / "masks").iterdir()) == ["val_00000.png", "val_00001.png"]
    assert infer_cli.main([str(ckpt), str(tmp_path / "nope"), "--no-progress"]) == 2


def test_an_interrupted_run_keeps_every_image_label(trained, tmp_path, monkeypatch):
    """Killed after its first mask, then re-run: image_labels.json and the gallery still list every image."""
    root, ckpt = trained
    inp, out = tmp_path / "in", tmp_path / "out"
    layout = make_input(root, inp)
    opts = InferenceOptions(scales=(1.0,), flip=False, gallery=True, progress=False, num_workers=0)
    real_save_mask, saved = loop.save_mask, []

    def killed_after_one(path, *args):
        if saved:
            raise KeyboardInterrupt  # as a SIGINT/SIGTERM lands mid-run
        saved.append(path)
        real_save_mask(path, *args)

    monkeypatch.setattr(loop, "save_mask", killed_after_one)
    with pytest.raises(KeyboardInterrupt):
        run_inference(ckpt, inp, out, options=opts)
    monkeypatch.setattr(loop, "save_mask", real_save_mask)
    assert len(saved) == 1 and not (out / "image_labels.json").exists()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = saved[0].parent / f"{temporary_prefix('x.png', int(dead.stdout))}q1w2e3r4.tmp"  # a SIGKILL leaves it
    stale.write_bytes(b"half a mask")

    summary = run_inference(ckpt, inp, out, options=opts)
    assert summary.existing == 1 and summary.done == 2
    assert not stale.exists()
    labels = json.loads((out / "image_labels.json").read_text())
    assert set(labels["images"]) == set(layout) and labels["classes"] == list(TOY_CLASSES)
    first = PurePosixPath(saved[0].relative_to(out / "masks")).with_suffix(".jpg").as_posix()
    assert labels["images"][first]["present"]
    page = (out / "index.html").read_text().splitlines()
    (row,) = [line for line in page if line.startswith(f'<div class="row"><div class="name">{first}<')]
    assert [n for n in TOY_CLASSES if f"</span> {n} " in row] == labels["images"][first]["present"]  # its CAMs


def test_a_full_disk_names_the_file_and_keeps_what_is_done(trained, tmp_path, monkeypatch, capsys):
    """The disk fills while one mask is written: one error line naming it, the images before it complete, the
    summary and image_labels.json written; a re-run after that finishes the rest."""
    root, ckpt = trained
    inp, out = tmp_path / "in", tmp_path / "out"
    make_input(root, inp)  # processed in the order z.jpg, a/x.jpg, a/b/y.jpg
    full = out / "masks" / "a" / "x.png"
    real_open = fileio.atomic_open

    def disk_full_for_one(path, mode="wb"):
        if Path(path) == full:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(path, mode)

    monkeypatch.setattr(fileio, "atomic_open", disk_full_for_one)
    args = [str(ckpt), str(inp), str(out), "--scales", "1.0", "--no-flip", "--workers", "0", "--no-progress",
            "--gallery", "--write-threads", "1"]  # fmt: skip  (one writer: no image is written beside the failing one)
    assert infer_cli.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: cannot write {full}: the disk is full"), err
    assert "1 image finished in this run" in err[0] and "2 not finished" in err[0], err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["done"] == 1 and str(full) in summary["error"]
    assert (out / "masks" / "z.png").is_file() and not full.exists() and not (out / "masks" / "a" / "b").exists()
    assert set(json.loads((out / "image_labels.json").read_text())["images"]) == {"z.jpg"}
    assert 'src="thumbs/z.jpg"' in (out / "index.html").read_text()
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]

    monkeypatch.undo()
    assert infer_cli.main(args) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["done"] == 2 and summary["existing"] == 1 and "error" not in summary


def test_label_scores_are_the_segmenters_class_probabilities(trained, tmp_path):
    """labels/<rel>.json and image_labels.json hold, for every foreground class by name, the probability
    Segmenter gives the same image (sigmoid of the classifier logits, rounded to 4 decimals), and ``present`` is
    Segmenter's."""
    from wsss.inference.predictor import Segmenter

    root, ckpt = trained
    inp, out = tmp_path / "in", tmp_path / "out"
    layout = make_input(root, inp)
    opts = InferenceOptions(scales=(1.0, 0.75), flip=True, num_workers=0, progress=False)
    assert run_inference(ckpt, inp, out, options=opts).done == 3
    segmenter = Segmenter.from_checkpoint(ckpt, "cpu")
    merged = json.loads((out / "image_labels.json").read_text())["images"]
    spread = []
    for rel in layout:
        entry = json.loads((out / "labels" / f"{rel[: -len('.jpg')]}.json").read_text())
        expected = segmenter(inp / rel, scales=(1.0, 0.75), flip=True)
        assert list(entry["scores"]) == list(TOY_CLASSES[1:])
        assert all(0.0 <= p <= 1.0 for p in entry["scores"].values())
        assert entry["scores"] == pytest.approx(expected.class_probs, abs=6e-5)
        assert entry["present"] == expected.present and entry["top1_fallback"] == expected.top1_fallback
        assert merged[rel] == {k: v for k, v in entry.items() if k != "classes"}
        spread.append(np.ptp(list(entry["scores"].values())))
    assert max(spread) > 0.05  # the classes' probabilities differ: a mix-up of names shows
