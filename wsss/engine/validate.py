"""Validation during training: CAM, aux-CAM and segmentation mIoU on the val split, plus a few pictures; on a
val set with tags only, classification mAP, F1 and each class's AP. :func:`best_metric` names the score that picks
the best checkpoint.

A val image (or mask) that cannot be read is skipped, as a bad training image is: the scores cover the others,
and :attr:`ValResult.skipped` says why each was left out (the training loop writes it to the log). More than
``data.max_bad_images`` of them, or none readable, stop the validation with the first reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, Subset
from tqdm import tqdm

from wsss.cam import cam_to_label, labels_from_mask, multiscale_cam
from wsss.config import Config
from wsss.data.transforms import denormalize
from wsss.data.voc import SkipUnreadable, TaggedValDataset, VOCSegDataset, collate_list
from wsss.evaluation.classification import multilabel_scores
from wsss.evaluation.metrics import ConfusionMatrix, SegMetrics
from wsss.inference.folder.visualize import cam_overlay, mask_overlay, titled_panels
from wsss.models.segmentor import WSSSModel, maps_to_pixels
from wsss.par import PAR
from wsss.pseudo_label import pseudo_labels
from wsss.utils.distributed import all_gather_objects
from wsss.utils.tensors import argmax, to_device

PANEL_TITLES = ("image", "CAM", "pseudo label", "prediction", "ground truth")


@dataclass
class ValResult:
    """mIoU (percent) of each branch (without masks: classification ``cls_mAP``, ``cls_F1`` and ``AP_<class>``),
    pictures of the first images."""

    metrics: dict[str, float]
    tables: dict[str, SegMetrics] = field(default_factory=dict)
    pictures: dict[str, np.ndarray] = field(default_factory=dict)
    """Name -> (H, W, 3) uint8: the image, CAM, pseudo label, prediction and ground truth side by side, each
    titled (:data:`PANEL_TITLES`)."""
    notes: list[str] = field(default_factory=list)
    """What could not be measured, and why."""
    skipped: list[str] = field(default_factory=list)
    """Why each val image left out was unreadable (of every rank), each naming its file."""


@torch.no_grad()
def validate(
    model: WSSSModel,
    dataset: VOCSegDataset | TaggedValDataset,
    cfg: Config,
    device: torch.device,
    max_images: int | None = None,
    num_pictures: int = 4,
) -> ValResult:
    """Score the model on ``dataset``: multi-scale CAMs of the final and aux classifiers (thresholded at
    ``cfg.cam.infer_bg_thresh``, image-level labels from the ground truth as in the WSSS literature) and
    single-scale segmentation. One confusion-matrix implementation (:mod:`wsss.evaluation.metrics`) serves all.

    With ``cfg.train.val_input == "crop"`` (the reference) each image is resized to ``data.crop_size``
    squared and the CAMs and segmentation logits are resized back to the mask; with ``"original"`` the
    model sees the image at its own size.

    Under ``torchrun`` every rank scores every ``world_size``-th image and the matrices are summed, so
    all ranks must call this together; pictures come from rank 0's first images.

    A tag-only val set (:class:`~wsss.data.voc.TaggedValDataset`) goes to :func:`validate_tags`.

    Raises:
        ValueError: More than ``cfg.data.max_bad_images`` val images cannot be read, or none can (the images
            that cannot be read are otherwise skipped and listed in ``ValResult.skipped``).
    """
    if isinstance(dataset, TaggedValDataset):
        return validate_tags(model, dataset, cfg, device, max_images, num_pictures)
    was_training = model.training
    model.eval()
    num_classes = len(dataset.classes)
    matrices = {name: ConfusionMatrix(num_classes, device=device) for name in ("cam", "aux_cam", "seg")}
    par = PAR.from_config(cfg.par).to(device)
    total = len(dataset) if max_images is None else min(max_images, len(dataset))
    rank, loader = _shard_loader(dataset, total, cfg)
    pictures, skipped = {}, []
    for i, batch in enumerate(tqdm(loader, desc="val", leave=False, dynamic_ncols=True, disable=rank > 0)):
        if "skipped" in batch:
            skipped.append(batch["skipped"][0])
            continue
        mask = batch["mask"][0]
        image = to_device(batch["image"][0][None], device)
        gt = to_device(mask, device)
        labels = to_device(labels_from_mask(mask, num_classes)[None], device)  # from the host's mask: no device read
        size = tuple(gt.shape)
        image = _model_input(image, cfg)
        crop_size = tuple(image.shape[-2:])  # CAMs are already pixels (stride 1); the seg logits are tokens
        cam = maps_to_pixels(multiscale_cam(model.cam, image, labels, cfg.cam.scales), crop_size, 1, size)
        aux_cam = multiscale_cam(lambda x: model.cam(x, aux=True), image, labels, cfg.cam.scales)
        aux_cam = maps_to_pixels(aux_cam, crop_size, 1, size)
        seg = argmax(maps_to_pixels(model(image).seg, crop_size, model.stride, size), 1)
        cam_pred = cam_to_label(cam, labels, cfg.cam.infer_bg_thresh)
        matrices["cam"].update(cam_pred, gt[None])
        matrices["aux_cam"].update(cam_to_label(aux_cam, labels, cfg.cam.infer_bg_thresh), gt[None])
        matrices["seg"].update(seg, gt[None])
        if rank == 0 and i < num_pictures:
            raw = batch["raw"][0]
            pseudo = pseudo_labels(
                denormalize(batch["image"][0][None].to(device), dataset.mean, dataset.std), cam, labels, None, par,
                cfg.cam.fg_thresh, cfg.cam.bg_thresh, cfg.par.scale, cfg.data.ignore_index,
            )  # fmt: skip
            panels = [
                raw,
                cam_overlay(raw, cam[0][labels[0] > 0].cpu().numpy()),
                mask_overlay(raw, pseudo[0].cpu().numpy()),
                mask_overlay(raw, seg[0].cpu().numpy()),
                mask_overlay(raw, gt.cpu().numpy()),
            ]
            pictures[str(batch["id"][0])] = titled_panels(panels, PANEL_TITLES)
    if was_training:
        model.train()
    skipped = _all_skipped(skipped, total, dataset, cfg)
    metrics, tables = {}, {}
    for name, cm in matrices.items():
        cm.all_reduce()
        result = cm.compute(class_names=dataset.classes)
        metrics[f"{name}_mIoU"] = result.summary["mIoU"]
        tables[name] = result
    return ValResult(metrics=metrics, tables=tables, pictures=pictures, skipped=skipped)


def _model_input(image: torch.Tensor, cfg: Config) -> torch.Tensor:
    """(1, 3, H, W) -> what the model sees: resized to the crop squared when ``train.val_input == "crop"``."""
    if cfg.train.val_input != "crop":
        return image
    crop = (cfg.data.crop_size, cfg.data.crop_size)
    return F.interpolate(image, size=crop, mode="bilinear", align_corners=False)


def _all_skipped(skipped: list[str], total: int, dataset: VOCSegDataset | TaggedValDataset, cfg: Config) -> list[str]:
    """The reasons of every rank's skipped images (all ranks must call it together).

    Raises:
        ValueError: More than ``cfg.data.max_bad_images`` were skipped, or all ``total`` of them.
    """
    skipped = [reason for part in all_gather_objects(skipped) for reason in part]
    if len(skipped) > cfg.data.max_bad_images:
        raise ValueError(
            f"{len(skipped)} val images could not be read (more than data.max_bad_images = "
            f"{cfg.data.max_bad_images}), the first: {skipped[0]}. Run tools/check_dataset.py to list them."
        )
    if skipped and len(skipped) == total:
        raise ValueError(f"no image of {dataset.split_file} can be read; run tools/check_dataset.py")
    return skipped


def _shard_loader(dataset, total: int, cfg: Config) -> tuple[int, DataLoader]:
    """This rank and a loader over its share (every ``world_size``-th) of the first ``total`` images, each
    unreadable one as a skip marker (:class:`~wsss.data.voc.SkipUnreadable`)."""
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    loader = DataLoader(
        Subset(SkipUnreadable(dataset), range(rank, total, world)),
        batch_size=1,
        num_workers=min(2, cfg.data.num_workers),
        collate_fn=collate_list,
        generator=torch.Generator(),  # leaves the global RNG stream (and so training) untouched
    )
    return rank, loader


MASKS_NEEDED = "segmentation mIoU needs masks: this val set has tags only (classification mAP and F1 instead)"


def best_metric(dataset: VOCSegDataset | TaggedValDataset) -> str:
    """The key of :attr:`ValResult.metrics` whose highest value picks the best checkpoint: ``seg_mIoU``, or
    ``cls_mAP`` on a val set with tags only (no mask to score a segmentation with)."""
    return "cls_mAP" if isinstance(dataset, TaggedValDataset) else "seg_mIoU"


@torch.no_grad()
def validate_tags(
    model: WSSSModel,
    dataset: TaggedValDataset,
    cfg: Config,
    device: torch.device,
    max_images: int | None = None,
    num_pictures: int = 4,
) -> ValResult:
    """Validate on images that have tags and no mask: classification mAP, F1 (at ``cfg.infer.cls_thresh``) and each
    class's AP (``AP_<class>``, as pre-training reports them: :func:`wsss.evaluation.classification.multilabel_scores`)
    of the final classifier (the input sized as ``cfg.train.val_input`` says) against the tags, and
    pictures of the first images (the image, the CAMs of its tagged classes, the segmentation). Segmentation
    mIoU cannot be measured; :data:`MASKS_NEEDED` says so in ``ValResult.notes``. Under ``torchrun`` every
    rank scores its share and the scores are gathered.
    """
    was_training = model.training
    model.eval()
    total = len(dataset) if max_images is None else min(max_images, len(dataset))
    rank, loader = _shard_loader(dataset, total, cfg)
    probs, targets, pictures, skipped = [], [], {}, []
    for i, batch in enumerate(tqdm(loader, desc="val", leave=False, dynamic_ncols=True, disable=rank > 0)):
        if "skipped" in batch:
            skipped.append(batch["skipped"][0])
            continue
        image = _model_input(batch["image"][0][None].to(device), cfg)
        out = model(image)
        probs.append(out.logits.float().sigmoid()[0].cpu())
        targets.append(batch["label"][0])
        if rank == 0 and i < num_pictures:
            raw, labels = batch["raw"][0], batch["label"][0][None].to(device)
            size, seen = tuple(raw.shape[:2]), tuple(image.shape[-2:])
            cam = maps_to_pixels(multiscale_cam(model.cam, image, labels, cfg.cam.scales), seen, 1, size)
            seg = argmax(maps_to_pixels(out.seg, seen, model.stride, size), 1)
            cams = cam_overlay(raw, cam[0][labels[0] > 0].cpu().numpy())
            pictures[str(batch["id"][0])] = np.concatenate([raw, cams, mask_overlay(raw, seg[0].cpu().numpy())], axis=1)
    if was_training:
        model.train()
    skipped = _all_skipped(skipped, total, dataset, cfg)
    gathered = all_gather_objects((torch.stack(probs).numpy(), torch.stack(targets).numpy()) if probs else None)
    parts = [p for p in gathered if p is not None]
    metrics = multilabel_scores(
        np.concatenate([p[0] for p in parts]),
        np.concatenate([p[1] for p in parts]),
        cfg.infer.cls_thresh,
        names=dataset.classes[1:],
    )
    return ValResult(metrics=metrics, pictures=pictures, notes=[MASKS_NEEDED], skipped=skipped)
