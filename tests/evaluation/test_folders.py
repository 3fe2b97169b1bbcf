"""Scoring folders of masks and tools/eval.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tools import eval as eval_cli
from wsss.data.classes import voc_palette
from wsss.evaluation.folders import evaluate_folders, index_masks
from wsss.evaluation.metrics import ConfusionMatrix, format_table
from wsss.utils.fileio import save_mask


def write_folders(root: Path, num: int = 5, seed: int = 7):
    """gt/[sub/]<id>.png (palette) and pred/[sub/]<id>.png (gray), some nested, plus one unscored pred."""
    rng = np.random.default_rng(seed)
    pairs = {}
    for i in range(num):
        key = f"set{i % 2}/img_{i}" if i % 3 else f"img_{i}"
        h, w = 12 + i, 17 + 2 * i
        gt = rng.integers(0, 3, size=(h, w)).astype(np.uint8)
        gt[0] = 255
        pred = np.where(rng.random((h, w)) < 0.7, gt, rng.integers(0, 3, size=(h, w))).astype(np.uint8)
        pred[0] = 1
        save_mask(root / "gt" / f"{key}.png", gt, voc_palette())
        save_mask(root / "pred" / f"{key}.png", pred)
        pairs[key] = (pred, gt)
    save_mask(root / "pred" / "unscored.png", np.zeros((5, 5), np.uint8))
    return pairs


def test_evaluate_folders_matches_in_memory(tmp_path: Path) -> None:
    pairs = write_folders(tmp_path)
    assert set(index_masks(tmp_path / "gt")) == set(pairs)
    cm = ConfusionMatrix(3)
    for pred, gt in pairs.values():
        cm.update(pred, gt)
    for workers in (0, 2):
        result = evaluate_folders(tmp_path / "pred", tmp_path / "gt", 3, num_workers=workers)
        assert result.summary == cm.compute().summary
    subset = ["img_0.png", "set1/img_1"]
    cm_sub = ConfusionMatrix(3)
    for key in ("img_0", "set1/img_1"):
        cm_sub.update(*pairs[key])
    assert evaluate_folders(tmp_path / "pred", tmp_path / "gt", 3, ids=subset).summary == cm_sub.compute().summary


def test_cli_writes_table_and_json(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pairs = write_folders(tmp_path)
    (tmp_path / "classes.txt").write_text("background\ncat\ndog\n")
    out = tmp_path / "out" / "metrics.json"
    argv = [str(tmp_path / "pred"), str(tmp_path / "gt"), "--classes", str(tmp_path / "classes.txt")]
    assert eval_cli.main([*argv, "--json", str(out), "--workers", "2"]) == 0
    cm = ConfusionMatrix(3)
    for pred, gt in pairs.values():
        cm.update(pred, gt)
    expected = cm.compute(class_names=["background", "cat", "dog"])
    data = json.loads(out.read_text())
    assert {k: data[k] for k in ("aAcc", "mIoU", "mAcc")} == expected.summary
    assert data["per_class"]["IoU"] == dict(
        zip(["background", "cat", "dog"], expected.per_class["IoU"].tolist(), strict=True)
    )
    assert set(data["per_class"]) == {"IoU", "Acc"}
    printed = capsys.readouterr().out
    assert format_table(expected) in printed and f"mIoU {expected['mIoU']:.2f}" in printed


def test_cli_errors_name_the_files(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    write_folders(tmp_path)
    pred, gt = str(tmp_path / "pred"), str(tmp_path / "gt")
    (tmp_path / "pred" / "set1" / "img_1.png").unlink()
    assert eval_cli.main([pred, gt, "--num-classes", "3"]) == 2
    err = capsys.readouterr().err
    assert "1 of 5 ground-truth masks have no prediction" in err and "set1/img_1" in err

    save_mask(tmp_path / "pred" / "set1" / "img_1.png", np.zeros((4, 4), np.uint8))
    assert eval_cli.main([pred, gt, "--num-classes", "3"]) == 2
    err = capsys.readouterr().err
    assert "size mismatch" in err and str(tmp_path / "pred" / "set1" / "img_1.png") in err and "4x4" in err

    save_mask(tmp_path / "pred" / "set1" / "img_1.png", np.zeros((13, 19), np.uint8))
    assert eval_cli.main([pred, gt, "--num-classes", "3"]) == 0
    assert eval_cli.main([pred, gt, "--num-classes", "2"]) == 2  # labels 2 are out of range for 2 classes
    assert "outside [0, 2)" in capsys.readouterr().err


def test_cli_reduce_zero_label(tmp_path: Path) -> None:
    gt = np.array([[0, 1, 2, 3], [3, 3, 255, 1]], dtype=np.uint8)  # reduced: ignore, 0, 1, 2 / 2, 2, ignore, 0
    pred = np.array([[2, 0, 1, 1], [2, 0, 0, 0]], dtype=np.uint8)
    save_mask(tmp_path / "gt" / "a.png", gt)
    save_mask(tmp_path / "pred" / "a.png", pred)
    out = tmp_path / "m.json"
    argv = [str(tmp_path / "pred"), str(tmp_path / "gt"), "--num-classes", "3", "--reduce-zero-label"]
    assert eval_cli.main([*argv, "--json", str(out)]) == 0
    # scored (gt, pred): (0,0) (1,1) (2,1) (2,2) (2,0) (0,0): IoU [2/3, 1/2, 1/3]
    assert json.loads(out.read_text())["per_class"]["IoU"] == {"0": 66.67, "1": 50.0, "2": 33.33}


# ---------------------------------------------------------------------------------------- mmseg registry


def test_eval_cli_class_names_follow_the_dataset(tmp_path, capsys):
    """A 7-class set: the VOC default is refused, image_labels.json beside the masks or --classes name them."""
    rng = np.random.default_rng(0)
    names = ["background", "disc", "ring", "triangle", "cross", "star", "striped_square"]
    out = tmp_path / "run"
    for i in range(3):
        gt = rng.integers(0, 7, size=(10, 12)).astype(np.uint8)
        save_mask(tmp_path / "gt" / f"im{i}.png", gt, voc_palette())
        save_mask(out / "masks" / f"im{i}.png", gt)
    pred, gt = str(out / "masks"), str(tmp_path / "gt")

    assert eval_cli.main([pred, gt]) == 2
    captured = capsys.readouterr()
    assert "aeroplane" not in captured.out and "labels up to 6" in captured.err and "--num-classes 7" in captured.err

    (out / "image_labels.json").write_text(json.dumps({"classes": names, "images": {}}))  # as tools/infer.py writes
    assert eval_cli.main([pred, gt]) == 0
    printed = capsys.readouterr().out
    assert f"classes from {out / 'image_labels.json'}" in printed and "striped_square" in printed
    assert "nan" not in printed.lower() and "aeroplane" not in printed

    (tmp_path / "classes.txt").write_text("\n".join(["bg", *names[1:]]) + "\n")
    assert eval_cli.main([pred, gt, "--classes", str(tmp_path / "classes.txt")]) == 0
    printed = capsys.readouterr().out
    assert "| bg " in printed and "classes from" not in printed


def test_predictions_outside_the_classes_are_warned(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Predicted values >= C count as misses, which lowers mIoU: a warning gives their count and the first file."""
    pairs = write_folders(tmp_path)
    keys = sorted(pairs)
    for key, extra in ((keys[1], 7), (keys[3], 5)):  # values 3 and 200 in a 3-class run
        pred = pairs[key][0].copy()
        pred[1, :extra] = 3 if key == keys[1] else 200
        save_mask(tmp_path / "pred" / f"{key}.png", pred)
    argv = [str(tmp_path / "pred"), str(tmp_path / "gt"), "--num-classes", "3", "--workers", "0"]
    assert eval_cli.main(argv) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1, warnings
    assert "12 predicted pixels in 2 masks" in warnings[0] and "outside [0, 3)" in warnings[0], warnings[0]
    assert str(tmp_path / "pred" / f"{keys[1]}.png") in warnings[0]

    write_folders(tmp_path)  # predictions within the classes: no warning
    assert eval_cli.main(argv) == 0
    assert "warning:" not in capsys.readouterr().err
