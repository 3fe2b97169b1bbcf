"""tools/eval.py --certain-only: predicted-uncertain pixels (the ignore index in a prediction) are not scored, and
their share of the scored pixels is reported (tools/eval_cams.py's "certain pixels only")."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tools import eval as eval_cli
from wsss.evaluation.folders import evaluate_certain_pixels, evaluate_folders
from wsss.utils.fileio import save_mask

GT = np.array([[0, 1, 1, 2], [0, 255, 2, 2]], dtype=np.uint8)
PRED = np.array([[0, 255, 1, 1], [255, 255, 2, 0]], dtype=np.uint8)
# Scored (gt in [0, 3)): 7 pixels, 2 of them predicted 255 (the 255/255 pixel is not scored: gt ignored).
# Certain (gt, pred): (0,0) (1,1) (2,1) (2,2) (2,0): IoU 0 = 1/2, 1 = 1/2, 2 = 1/3; aAcc 3/5; Acc 1, 1, 1/3.
# Every pixel, 255 a miss: IoU 0 = 1/3, 1 = 1/3, 2 = 1/3.


def write_pair(root: Path) -> tuple[str, str]:
    save_mask(root / "gt" / "a.png", GT)
    save_mask(root / "pred" / "a.png", PRED)
    return str(root / "pred"), str(root / "gt")


def test_certain_pixels_by_hand(tmp_path: Path) -> None:
    pred, gt = write_pair(tmp_path)
    result = evaluate_certain_pixels(pred, gt, 3, num_workers=0)
    assert (result.uncertain, result.scored) == (2, 7)
    assert result.uncertain_fraction == pytest.approx(2 / 7)
    assert result.metrics.per_class["IoU"].tolist() == [50.0, 50.0, 33.33]
    assert result.metrics.summary == {"aAcc": 60.0, "mIoU": 44.44, "mAcc": 77.78}
    assert evaluate_folders(pred, gt, 3, num_workers=0).per_class["IoU"].tolist() == [33.33, 33.33, 33.33]


def test_cli_certain_only_writes_the_fraction(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pred, gt = write_pair(tmp_path)
    out = tmp_path / "m.json"
    assert eval_cli.main([pred, gt, "--num-classes", "3", "--certain-only", "--json", str(out)]) == 0
    printed = capsys.readouterr()
    data = json.loads(out.read_text())
    assert data["mIoU"] == 44.44 and data["certain_only"] is True
    assert data["uncertain_pixels"] == 2 and data["scored_pixels"] == 7
    assert data["uncertain_fraction"] == pytest.approx(2 / 7)
    assert "2 of 7 scored pixels (28.57 %) predicted uncertain (255)" in printed.out
    assert "warning" not in printed.err  # 255 in a prediction is uncertain here, not a class outside [0, 3)

    assert eval_cli.main([pred, gt, "--num-classes", "3", "--json", str(out)]) == 0  # every pixel: 255 is a miss
    assert json.loads(out.read_text())["mIoU"] == 33.33 and "certain_only" not in json.loads(out.read_text())
    assert "outside [0, 3)" in capsys.readouterr().err


def test_certain_only_needs_an_ignore_index_outside_the_classes(tmp_path: Path, capsys) -> None:
    pred, gt = write_pair(tmp_path)
    assert eval_cli.main([pred, gt, "--num-classes", "3", "--certain-only", "--ignore-index", "2"]) == 2
    assert "--certain-only" in capsys.readouterr().err
