"""WSSSIoUMetric in mmseg's registry: the numbers of mmseg's IoUMetric; wsss.evaluation works without mmseg."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from tests.evaluation.test_metrics import ALL_METRICS, hand_example, random_pairs, run_mmseg


def test_mmseg_registry_metric_matches_iou_metric(tmp_path: Path) -> None:
    from mmengine.utils import import_modules_from_strings
    from mmseg.registry import METRICS

    import_modules_from_strings(["wsss.evaluation.mmseg_metric"])  # what `custom_imports` in a config does
    from wsss.evaluation.mmseg_metric import WSSSIoUMetric

    assert METRICS.get("WSSSIoUMetric") is WSSSIoUMetric
    pairs = random_pairs(8, 21)
    for metrics in (["mIoU"], ALL_METRICS):
        reference, _ = run_mmseg(pairs, 21, metrics)
        ours, _ = run_mmseg(pairs, 21, metrics, metric_type="WSSSIoUMetric")
        assert ours.keys() == reference.keys()
        for key in reference:
            assert ours[key] == pytest.approx(reference[key], abs=1e-4), key

    metric = METRICS.build(dict(type="WSSSIoUMetric", output_dir=str(tmp_path / "out"), prefix="val"))
    metric.dataset_meta = dict(classes=["a", "b", "c"])
    pred, gt = hand_example()
    pred = np.minimum(pred, 2)
    sample = dict(
        pred_sem_seg=dict(data=torch.from_numpy(pred)[None].long()),
        gt_sem_seg=dict(data=torch.from_numpy(gt)[None]),
        img_path="/x/y/2007_000033.jpg",
    )
    metric.process({}, [sample, sample])
    # evaluate(size=1) keeps one of the two samples (mmengine drops the padding of distributed samplers):
    # tp = [1, 4, 3], gt area = [3, 4, 4], pred area = [2, 5, 4] -> IoU [1/4, 4/5, 3/5], Acc [1/3, 1, 3/4]
    assert metric.evaluate(1) == {"val/aAcc": 72.73, "val/mIoU": 55.0, "val/mAcc": 69.44}
    with Image.open(tmp_path / "out" / "2007_000033.png") as im:
        np.testing.assert_array_equal(np.asarray(im), pred)


@pytest.mark.slow
def test_evaluation_imports_without_mmseg() -> None:
    code = "import sys, wsss.evaluation.metrics; assert 'mmseg' not in sys.modules and 'mmengine' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
