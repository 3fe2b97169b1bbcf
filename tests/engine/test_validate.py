"""Validation during training: the reference's resize-to-crop mode and the original-size mode."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.conftest import tiny_config
from wsss.data.transforms import backbone_mean_std
from wsss.data.voc import VOCSegDataset
from wsss.engine.validate import validate
from wsss.models import build_model, maps_to_pixels

pytestmark = pytest.mark.usefixtures("one_thread")


def seg_miou(preds: list[np.ndarray], gts: list[np.ndarray], num_classes: int) -> float:
    inter, union = np.zeros(num_classes), np.zeros(num_classes)
    for p, g in zip(preds, gts, strict=True):
        keep = g < num_classes
        for c in range(num_classes):
            inter[c] += np.sum((p[keep] == c) & (g[keep] == c))
            union[c] += np.sum((p[keep] == c) | (g[keep] == c))
    with np.errstate(invalid="ignore"):
        return float(np.nanmean(inter / union) * 100)


@pytest.mark.parametrize("mode", ["crop", "original"])
def test_validation_input_size(tiny_voc, mode):
    cfg = tiny_config(tiny_voc)
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, val_input=mode))
    mean, std = backbone_mean_std(cfg.model.backbone)
    dataset = VOCSegDataset(cfg.data, mean, std)
    torch.manual_seed(0)
    model = build_model(cfg.model, num_classes=3)
    sizes = []
    hook = model.backbone.register_forward_pre_hook(lambda m, args: sizes.append(tuple(args[0].shape[-2:])))
    result = validate(model, dataset, cfg, torch.device("cpu"), num_pictures=0)
    hook.remove()
    assert model.training  # validate() gives the model back in the mode it found it
    model.eval()
    crop = cfg.data.crop_size
    expected_inputs = set()
    preds, gts = [], []
    with torch.no_grad():
        for item in dataset:
            image, gt = item["image"][None], item["mask"].numpy()
            x = image
            if mode == "crop":
                x = F.interpolate(image, size=(crop, crop), mode="bilinear", align_corners=False)
            expected_inputs |= {(int(s * x.shape[-2]), int(s * x.shape[-1])) for s in cfg.cam.scales}
            seg = maps_to_pixels(model(x).seg, tuple(x.shape[-2:]), model.stride, gt.shape)
            preds.append(seg.argmax(1)[0].numpy())
            gts.append(gt)
    assert set(sizes) == expected_inputs
    if mode == "crop":
        assert set(sizes) == {(crop, crop), (crop // 2, crop // 2)}
    assert result.metrics["seg_mIoU"] == pytest.approx(seg_miou(preds, gts, 3), abs=0.006)  # reported to 2 decimals
