"""Validation during training: the reference's resize-to-crop mode and the original-size mode, every mIoU column
against an independent computation."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.conftest import tiny_config, tiny_tagged_config
from wsss.cam import multiscale_cam
from wsss.data.transforms import backbone_mean_std
from wsss.data.voc import TaggedValDataset, VOCSegDataset, val_dataset
from wsss.engine.validate import MASKS_NEEDED, validate
from wsss.evaluation.classification import multilabel_scores
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


def cam_label(cam: np.ndarray, gt: np.ndarray, bg_thresh: float, num_classes: int) -> np.ndarray:
    """(C-1, H, W) CAMs -> (H, W) labels: argmax over [bg_thresh, CAMs of the classes in ``gt``] (ties: background)."""
    present = [c for c in np.unique(gt) if 0 < c < num_classes]
    scores = np.concatenate([np.full((1, *gt.shape), bg_thresh), cam[[c - 1 for c in present]]])
    return np.array([0, *present])[scores.argmax(axis=0)]


@pytest.mark.parametrize("mode", ["crop", "original"])
def test_validation_input_size(tiny_voc, mode):
    """The model sees the input ``train.val_input`` says; seg, CAM and aux-CAM mIoU equal a computation by hand, the
    CAMs thresholded at ``cam.infer_bg_thresh`` (set far from the training ``cam.bg_thresh``, so a swap shows)."""
    cfg = tiny_config(tiny_voc)
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, val_input=mode))
    cfg.cam.bg_thresh, cfg.cam.infer_bg_thresh = 0.05, 0.6
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
    preds, gts, cams = [], [], {"cam": [], "aux_cam": []}
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
            labels = torch.zeros(1, 2)
            labels[0, [c - 1 for c in np.unique(gt) if 0 < c < 3]] = 1.0
            for name, aux in (("cam", False), ("aux_cam", True)):
                cam = multiscale_cam(lambda v, aux=aux: model.cam(v, aux=aux), x, labels, cfg.cam.scales)
                cams[name].append(F.interpolate(cam, size=gt.shape, mode="bilinear", align_corners=False)[0].numpy())
    assert set(sizes) == expected_inputs
    if mode == "crop":
        assert set(sizes) == {(crop, crop), (crop // 2, crop // 2)}
    assert result.metrics["seg_mIoU"] == pytest.approx(seg_miou(preds, gts, 3), abs=0.006)  # reported to 2 decimals
    for name, maps in cams.items():
        expected, at_train_thresh = (
            seg_miou([cam_label(m, g, thresh, 3) for m, g in zip(maps, gts, strict=True)], gts, 3)
            for thresh in (cfg.cam.infer_bg_thresh, cfg.cam.bg_thresh)
        )
        assert result.metrics[f"{name}_mIoU"] == pytest.approx(expected, abs=0.006), name
        assert abs(expected - at_train_thresh) > 1.0, name  # the case tells the two thresholds apart


@pytest.mark.parametrize("mode", ["crop", "original"])
def test_tag_only_validation_scores_the_classifier(tiny_tagged, mode):
    """No masks: mAP, F1 and each class's AP of the classifier's sigmoid against the tags, the note, the pictures."""
    cfg = tiny_tagged_config(tiny_tagged)
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, val_input=mode))
    mean, std = backbone_mean_std(cfg.model.backbone)
    dataset = val_dataset(cfg.data, mean, std)
    assert isinstance(dataset, TaggedValDataset)
    torch.manual_seed(0)
    model = build_model(cfg.model, num_classes=3).eval()
    probs, targets = [], []
    with torch.no_grad():
        for i in range(len(dataset)):
            x = dataset[i]["image"][None]
            if mode == "crop":
                x = F.interpolate(x, size=(32, 32), mode="bilinear", align_corners=False)
            probs.append(model(x).logits.sigmoid()[0].numpy())
            targets.append(dataset[i]["label"].numpy())
    res = validate(model, dataset, cfg, torch.device("cpu"), num_pictures=2)
    expected = multilabel_scores(np.stack(probs), np.stack(targets), cfg.infer.cls_thresh, names=["cat", "dog"])
    assert res.metrics == pytest.approx(expected)
    assert set(res.metrics) == {"cls_mAP", "cls_F1", "AP_cat", "AP_dog"} and not res.tables  # per class, as pretrain
    assert res.notes == [MASKS_NEEDED] and "mIoU needs masks" in MASKS_NEEDED
    first = dataset[0]["raw"]
    assert list(res.pictures) == dataset.ids[:2]
    assert res.pictures[dataset.ids[0]].shape == (first.shape[0], 3 * first.shape[1], 3)
