"""tools/infer.py INPUT as one image file or a --list of paths: the outputs of a folder run, confined to INPUT."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from tools import infer as infer_cli
from wsss.inference.predictor import Segmenter
from wsss.utils.fileio import read_image, read_mask

pytestmark = pytest.mark.usefixtures("one_thread")

FAST = ["--scales", "1.0", "--no-flip", "--workers", "0", "--no-progress"]


def test_one_image_file_as_input(toy_checkpoint, tmp_path, capsys):
    """A file is segmented as its folder would segment it; OUTPUT defaults to <stem>_pred beside it."""
    root, ckpt = toy_checkpoint
    photo = tmp_path / "photos" / "cat.jpg"
    photo.parent.mkdir()
    shutil.copy(root / "JPEGImages" / "val_00000.jpg", photo)
    shutil.copy(root / "JPEGImages" / "val_00001.jpg", tmp_path / "photos" / "other.jpg")  # not read
    assert infer_cli.main([str(ckpt), str(photo), "--overlay", *FAST]) == 0
    out = tmp_path / "photos" / "cat_pred"
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*.*") if p.parent != out) == [
        "labels/cat.json", "masks/cat.png", "overlays/cat.jpg",
    ]  # fmt: skip
    expected = Segmenter.from_checkpoint(ckpt, "cpu")(read_image(photo), scales=(1.0,), flip=False).mask
    np.testing.assert_array_equal(read_mask(out / "masks" / "cat.png"), expected)
    labels = json.loads((out / "image_labels.json").read_text())
    assert list(labels["images"]) == ["cat.jpg"]

    assert infer_cli.main([str(ckpt), str(photo), str(tmp_path / "o2"), "--split", "val", *FAST]) == 2
    assert "--split needs a folder as INPUT" in capsys.readouterr().err
    assert infer_cli.main([str(ckpt), str(tmp_path / "photos" / "missing.jpg"), *FAST]) == 2
    assert f"INPUT {tmp_path / 'photos' / 'missing.jpg'} not found" in capsys.readouterr().err


def test_a_list_of_paths_under_input(toy_checkpoint, tmp_path):
    """--list reads the listed images under INPUT (relative or absolute inside it, once each) and skips, naming the
    line, what climbs out, what is absolute outside INPUT and what is missing; comments and blank lines are
    ignored."""
    root, ckpt = toy_checkpoint
    inp = tmp_path / "in"
    (inp / "sub").mkdir(parents=True)
    for name, image_id in [("a.jpg", "val_00000"), ("sub/b.jpg", "val_00001"), ("c.jpg", "train_00000")]:
        shutil.copy(root / "JPEGImages" / f"{image_id}.jpg", inp / name)
    outside = tmp_path / "secret.jpg"
    shutil.copy(root / "JPEGImages" / "train_00001.jpg", outside)
    listing = tmp_path / "list.txt"
    listing.write_text(
        f"# my picks\n\na.jpg\n{inp / 'sub' / 'b.jpg'}\nsub\\b.jpg\n../secret.jpg\n{outside}\nnope.jpg\n",
        encoding="utf-8",
    )
    out = tmp_path / "out"
    assert infer_cli.main([str(ckpt), str(inp), str(out), "--list", str(listing), *FAST]) == 0
    assert sorted(p.relative_to(out / "masks").as_posix() for p in (out / "masks").rglob("*.png")) == [
        "a.png", "sub/b.png",
    ]  # fmt: skip
    summary = json.loads((out / "summary.json").read_text())
    assert summary["done"] == 2
    reasons = {s["reason"].split(": ")[0] for s in summary["skipped"]}
    assert reasons == {f"{listing}:6", f"{listing}:7", f"{listing}:8"}
    run = json.loads((out / "run.json").read_text())
    assert run["list"] == str(listing.resolve())
