"""WSSSIoUMetric inside mmengine's own validation loop, configured as an mmseg user would; what of mmseg runs
with mmcv-lite (no compiled ops) and where the limit is."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

import pytest
import torch

from tests.evaluation.test_metrics import ALL_METRICS

CLASSES = ("background", "cat", "dog", "bird")


def _runner_val(tmp_path: Path, evaluator_type: str) -> dict[str, float]:
    """``Runner.val()`` of a model that predicts a noisy copy of each mask, from a config file as mmseg loads it."""
    from mmengine.config import Config
    from mmengine.model import BaseModel
    from mmengine.runner import Runner
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample

    class Pairs(torch.utils.data.Dataset):
        metainfo = dict(classes=CLASSES)

        def __init__(self) -> None:
            g = torch.Generator().manual_seed(0)
            self.gt = torch.randint(0, len(CLASSES), (7, 12, 10), generator=g)
            self.gt[:, :2] = 255
            self.gt[:, :, -1] = 3  # class 3 is never predicted: IoU 0 there, not NaN
            noise = torch.randint(0, 3, self.gt.shape, generator=g)
            self.pred = torch.where(torch.rand(self.gt.shape, generator=g) < 0.6, self.gt.clamp(max=2), noise)

        def __len__(self) -> int:
            return len(self.gt)

        def __getitem__(self, i: int) -> dict:
            sample = SegDataSample(gt_sem_seg=PixelData(data=self.gt[i][None]), metainfo=dict(img_path=f"{i}.jpg"))
            return dict(inputs=self.pred[i], data_samples=sample)

    class Echo(BaseModel):
        def __init__(self) -> None:
            super().__init__()
            self.unused = torch.nn.Parameter(torch.zeros(1))

        def forward(self, inputs, data_samples=None, mode="predict"):
            for pred, sample in zip(inputs, data_samples, strict=True):
                sample.pred_sem_seg = PixelData(data=pred[None])
            return data_samples

    config = tmp_path / f"{evaluator_type}.py"
    config.write_text(
        'custom_imports = dict(imports=["wsss.evaluation.mmseg_metric"], allow_failed_imports=False)\n'
        f"val_evaluator = dict(type={evaluator_type!r}, iou_metrics={ALL_METRICS!r})\n"
        "val_cfg = dict()\n"
    )
    cfg = Config.fromfile(str(config))  # runs custom_imports, as mmseg's tools/train.py does
    loader = dict(
        dataset=Pairs(), sampler=dict(type="DefaultSampler", shuffle=False), batch_size=3,
        collate_fn=dict(type="default_collate"),
    )  # fmt: skip
    runner = Runner(
        model=Echo(), work_dir=str(tmp_path / evaluator_type), val_dataloader=loader, val_cfg=cfg.val_cfg,
        val_evaluator=cfg.val_evaluator, experiment_name=evaluator_type,
    )  # fmt: skip
    return runner.val()


def test_runner_val_loop_gives_iou_metric_numbers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mmengine.registry import DefaultScope

    monkeypatch.setattr(DefaultScope, "_instance_dict", OrderedDict())  # the Runner's scope ends with the test
    ours = _runner_val(tmp_path, "WSSSIoUMetric")
    reference = _runner_val(tmp_path, "mmseg.IoUMetric")
    assert list(ours) == list(reference) == ["aAcc", "mIoU", "mAcc", "mDice", "mFscore", "mPrecision", "mRecall"]
    assert ours == pytest.approx(reference, abs=1e-6)
    assert 30 < ours["mIoU"] < 70


def test_mmseg_modules_that_run_without_compiled_ops() -> None:
    """mmseg.registry, .structures and .evaluation import with mmcv-lite; .datasets, .models, .apis,
    .visualization and .engine import mmseg.utils, which needs mmcv.ops' compiled extension (full mmcv)."""
    ok = "import mmseg.registry, mmseg.structures, mmseg.evaluation, wsss.evaluation.mmseg_metric"
    subprocess.run([sys.executable, "-c", ok], check=True)
    if importlib.util.find_spec("mmcv._ext") is not None:
        pytest.skip("full mmcv with compiled ops is installed; the limit below does not apply")
    for module in ("mmseg.datasets", "mmseg.models", "mmseg.apis", "mmseg.visualization"):
        run = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True)
        assert run.returncode != 0 and "No module named 'mmcv._ext'" in run.stderr, (module, run.stderr[-500:])


def test_mmseg_base_config_inherits(tmp_path: Path) -> None:
    from mmengine.config import Config

    config = tmp_path / "cfg.py"
    config.write_text('_base_ = ["mmseg::_base_/default_runtime.py"]\nval_evaluator = dict(type="WSSSIoUMetric")\n')
    cfg = Config.fromfile(str(config))
    assert cfg.default_scope == "mmseg" and cfg.val_evaluator.type == "WSSSIoUMetric"
