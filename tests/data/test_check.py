"""Dataset pre-scan (tools/check_dataset.py) and training past an unreadable image."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tests.conftest import tiny_config
from tools import check_dataset as check_cli
from wsss.config import dump_config
from wsss.data.check import check_dataset
from wsss.data.transforms import backbone_mean_std
from wsss.data.voc import VOCClsDataset
from wsss.engine.train import train
from wsss.utils.fileio import save_mask

pytestmark = pytest.mark.usefixtures("one_thread")


def test_a_sound_dataset_has_no_problems(tiny_voc, tmp_path, capsys):
    cfg = tiny_config(tiny_voc)
    assert check_dataset(cfg.data, progress=False) == []
    dump_config(cfg, tmp_path / "cfg.py")
    assert check_cli.main([str(tmp_path / "cfg.py"), "--no-progress"]) == 0
    assert "no problems found" in capsys.readouterr().out


def test_every_problem_is_listed_with_its_file(tiny_voc, tmp_path, capsys):
    (tiny_voc / "JPEGImages" / "a1.jpg").write_bytes(b"\xff\xd8\xff truncated")
    (tiny_voc / "JPEGImages" / "a2.jpg").unlink()
    os.mkfifo(tiny_voc / "JPEGImages" / "a2.jpg")
    save_mask(tiny_voc / "SegmentationClass" / "b2.png", np.zeros((5, 5), np.uint8))  # image is 36 x 36
    labels = json.loads((tiny_voc / "cls_labels.json").read_text())
    labels["labels"]["b1"] = [1, 2]
    (tiny_voc / "cls_labels.json").write_text(json.dumps(labels))
    problems = {p.path: p.reason for p in check_dataset(tiny_config(tiny_voc).data, progress=False)}
    assert set(problems) == {
        str(tiny_voc / "cls_labels.json"),
        str(tiny_voc / "JPEGImages" / "a1.jpg"),
        str(tiny_voc / "JPEGImages" / "a2.jpg"),
        str(tiny_voc / "SegmentationClass" / "b2.png"),
    }
    assert "label of 'b1' holds 2" in problems[str(tiny_voc / "cls_labels.json")]
    assert problems[str(tiny_voc / "JPEGImages" / "a2.jpg")] == "not a regular file (named pipe)"
    assert "not a readable image" in problems[str(tiny_voc / "JPEGImages" / "a1.jpg")]
    dump_config(tiny_config(tiny_voc), tmp_path / "cfg.py")
    assert check_cli.main([str(tmp_path / "cfg.py"), "--no-progress"]) == 1
    assert "4 problem(s)" in capsys.readouterr().out
    cfg = tiny_config(tiny_voc)
    cfg.data.check_images = True
    with pytest.raises(ValueError, match="data.check_images: 4 problem"):
        train(cfg, work_dir=tmp_path / "w", device="cpu")
    assert not list((tmp_path / "w").glob("*.pth"))


def test_training_skips_an_unreadable_image_with_a_warning(tiny_voc, tmp_path, capsys):
    bad = tiny_voc / "JPEGImages" / "a1.jpg"
    bad.write_bytes(b"\xff\xd8\xff truncated")
    res = train(tiny_config(tiny_voc), work_dir=tmp_path / "w", device="cpu")
    assert res.step == 6
    err = capsys.readouterr().err
    assert f"warning: skipping training image {bad}: not a readable image" in err
    assert err.count("skipping training image") == 1  # warned once, then passed over

    mean, std = backbone_mean_std("vit_tiny_patch16_224")
    cfg = tiny_config(tiny_voc)
    ds = VOCClsDataset(cfg.data, mean, std, split="train")
    assert ds[0]["id"] == ds[1]["id"] == "a2"  # the next readable image takes a1's place
    cfg.data.max_bad_images = 0
    with pytest.raises(ValueError, match=r"1 training images could not be read .*a1.jpg.*check_dataset"):
        VOCClsDataset(cfg.data, mean, std, split="train")[0]
