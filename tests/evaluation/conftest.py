"""An untrained tiny model on the tiny set, shared by the tests of tools/test.py, eval_cams.py and report.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from tests.conftest import TINY_CLASSES, tiny_config
from wsss.config import dump_config
from wsss.data.transforms import backbone_mean_std
from wsss.engine.checkpoint import save_checkpoint
from wsss.models import build_model


@pytest.fixture
def checkpoint(tiny_voc: Path, tmp_path: Path) -> tuple[Path, Path]:
    """(config file, checkpoint) of an untrained tiny model on the tiny set, scored on its 3-image train split;
    its masks hold every class (``infer.mask_classes=all``), so the scores vary with every image."""
    cfg = tiny_config(tiny_voc)
    cfg.data = dataclasses.replace(cfg.data, val_split="train")
    cfg.infer.mask_classes = "all"
    cfg.infer.scales = (1.0, 0.5)
    torch.manual_seed(3)
    model = build_model(cfg.model, num_classes=len(TINY_CLASSES))
    mean, std = backbone_mean_std(cfg.model.backbone)
    path = tmp_path / "ckpt" / "iter_0.pth"
    path.parent.mkdir()
    save_checkpoint(path, model, cfg, TINY_CLASSES, mean, std, step=0)
    cfg_file = tmp_path / "cfg.py"
    dump_config(cfg, cfg_file)
    return cfg_file, path
