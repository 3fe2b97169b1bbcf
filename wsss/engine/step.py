"""One training step as plain functions: pseudo-label targets, the loss terms, their weighted total.

docs/design.md section 1::

    crops -> model -> L_cls (final classifier) + aux_weight * L_cls (aux classifier)
    from loss.seg_start_iter on, also:
    crops -> no-grad multi-scale CAM of the final classifier -> dual-threshold PAR pseudo labels (valid box)
          -> seg_weight * L_seg (balanced CE) + reg_weight * L_reg (dense energy on the seg softmax, RGB 0-255)

Nothing here reads a value back to the host: the terms stay tensors on the device, so a loop can
accumulate them and synchronise once per log interval.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from wsss.cam import multiscale_cam
from wsss.config import Config, LossConfig
from wsss.data.transforms import channel_constants, denormalize
from wsss.losses import DenseEnergyLoss, balanced_seg_ce, multilabel_soft_margin
from wsss.models.segmentor import ModelOutput, PixelResize, WSSSModel, maps_to_pixels
from wsss.par import PAR
from wsss.pseudo_label import boxes_to_mask, pseudo_labels

TERMS = ("cls", "aux", "seg", "reg")
"""The loss terms, in logging order."""


@dataclass
class PseudoTargets:
    """What the no-grad CAM pass gives the dense losses of a batch of B crops (H, W).

    Attributes:
        label: (B, H, W) long pseudo labels; ``ignore_index`` on uncertain pixels and outside the valid box.
        cams: (B, C-1, H, W) float32 CAMs of the final classifier in [0, 1].
        rgb: (B, 3, H, W) float32 de-normalised crops in [0, 1].
        valid: (B, H, W) bool, True inside the valid crop box.
    """

    label: Tensor
    cams: Tensor
    rgb: Tensor
    valid: Tensor


def loss_weights(it: int, cfg: LossConfig) -> dict[str, float]:
    """The weight of each term at iteration ``it`` (0-based): ``seg`` and ``reg`` are 0 before
    ``cfg.seg_start_iter`` (the reference keeps them at 0 while ``n_iter <= 2000``)."""
    dense = it >= cfg.seg_start_iter
    return {
        "cls": 1.0,
        "aux": cfg.aux_weight,
        "seg": cfg.seg_weight if dense else 0.0,
        "reg": cfg.reg_weight if dense else 0.0,
    }


@torch.no_grad()
def pseudo_label_targets(
    model: WSSSModel,
    images: Tensor,
    labels: Tensor,
    boxes: Tensor,
    par: PAR,
    cfg: Config,
    mean: tuple[float, ...] | Tensor,
    std: tuple[float, ...] | Tensor,
    cam_autocast: bool,
    max_present: int | None,
    autocast_cache: bool = True,
) -> PseudoTargets:
    """Pseudo labels of a batch from the model's own multi-scale CAMs (final classifier), without gradient.

    Args:
        model: The bare model, in the mode the caller chose (training runs it in train mode, as the reference).
        images: (B, 3, H, W) normalised crops.
        labels: (B, C-1) multi-hot image labels.
        boxes: (B, 4) valid boxes ``(y0, y1, x0, x1)``.
        par: The refinement module.
        cfg: ``cam.scales``, ``cam.fg_thresh``, ``cam.bg_thresh``, ``par.scale``, ``data.ignore_index``.
        mean: Normalisation mean of ``images`` (values, or :func:`wsss.data.transforms.channel_constants` on their
            device, which spares the upload).
        std: Normalisation std, likewise.
        cam_autocast: Run the CAM pass under bf16 autocast (``train.cam_dtype == "bfloat16"`` on a GPU).
        max_present: The largest number of classes in one image of the batch, counted on the host (None: counted
            on the device, which waits for it).
        autocast_cache: Autocast's cache of cast weights (off inside a captured graph).
    """
    h, w = images.shape[-2:]
    with torch.autocast(images.device.type, dtype=torch.bfloat16, enabled=cam_autocast, cache_enabled=autocast_cache):
        cams = multiscale_cam(model.cam, images, labels, cfg.cam.scales)
    rgb = denormalize(images.float(), mean, std)
    valid = boxes_to_mask(boxes, h, w)
    label = pseudo_labels(
        rgb, cams, labels, valid, par, cfg.cam.fg_thresh, cfg.cam.bg_thresh, cfg.par.scale, cfg.data.ignore_index,
        max_present,
    )  # fmt: skip
    return PseudoTargets(label=label, cams=cams, rgb=rgb, valid=valid)


def loss_terms(
    out: ModelOutput,
    labels: Tensor,
    stride: int,
    targets: PseudoTargets | None = None,
    energy: DenseEnergyLoss | None = None,
    ignore_index: int | None = None,
    to_pixels: Callable[..., Tensor] = maps_to_pixels,
) -> dict[str, Tensor]:
    """The unweighted loss terms (scalars, float32) of one forward pass.

    Args:
        out: The model's outputs for the batch.
        labels: (B, C-1) multi-hot image labels.
        stride: The model's output stride (to bring ``out.seg`` to the crop's pixels).
        targets: The pseudo labels; without them only ``cls`` and ``aux`` are computed.
        energy: The dense energy loss; without it ``reg`` is not computed.
        ignore_index: Pseudo-label value excluded from ``seg``.
        to_pixels: What brings ``out.seg`` to the crop's pixels: :func:`~wsss.models.segmentor.maps_to_pixels` or a
            :class:`~wsss.models.segmentor.PixelResize` (``loss.seg_resize``).

    Returns:
        ``cls`` and ``aux`` (multi-label soft margin of the final and aux classifiers), and with targets
        ``seg`` (balanced CE against the pseudo labels) and, with ``energy``, ``reg`` (dense energy of the
        segmentation softmax with the 0-255 crops, the valid box and the pseudo labels' gate).
    """
    terms = {
        "cls": multilabel_soft_margin(out.logits.float(), labels),
        "aux": multilabel_soft_margin(out.aux_logits.float(), labels),
    }
    if targets is not None:
        seg = to_pixels(out.seg.float(), tuple(targets.label.shape[-2:]), stride)
        terms["seg"] = balanced_seg_ce(seg, targets.label, ignore_index)
        if energy is not None:
            terms["reg"] = energy(targets.rgb * 255.0, seg.softmax(dim=1), targets.valid, targets.label)
    return terms


def total_loss(terms: dict[str, Tensor], weights: dict[str, float]) -> Tensor:
    """``sum_k weights[k] * terms[k]`` over the terms present."""
    return sum(weights[k] * v for k, v in terms.items())


class TrainingStep:
    """The loss of one training step; holds what the step needs besides the batch (PAR, energy loss, constants).

    Args:
        cfg: The resolved config.
        mean: Normalisation mean of the crops.
        std: Normalisation std.
        device: Where the step runs (bf16 autocast only on CUDA: the forward pass with ``train.amp``, the CAM pass
            with ``train.cam_dtype="bfloat16"``).
    """

    def __init__(self, cfg: Config, mean: tuple[float, ...], std: tuple[float, ...], device: torch.device):
        self.cfg = cfg
        self.mean, self.std = channel_constants(mean, device), channel_constants(std, device)  # uploaded once
        self.par = PAR.from_config(cfg.par).to(device)
        self.energy = DenseEnergyLoss.from_config(cfg.loss, cfg.data.ignore_index)
        self.to_pixels = PixelResize() if cfg.loss.seg_resize == "matmul" else maps_to_pixels
        self.amp = cfg.train.amp and device.type == "cuda"
        self.cam_autocast = cfg.train.cam_dtype == "bfloat16" and device.type == "cuda"
        self.autocast_cache = True
        """Autocast's cache of cast weights; :class:`wsss.engine.graphs.GraphedIteration` turns it off."""

    def targets(self, raw_model: WSSSModel, batch: dict) -> PseudoTargets:
        """:func:`pseudo_label_targets` of a batch with this step's constants."""
        return pseudo_label_targets(
            raw_model, batch["image"], batch["label"], batch["box"], self.par, self.cfg, self.mean, self.std,
            self.cam_autocast, batch.get("max_present"), self.autocast_cache,
        )  # fmt: skip

    def __call__(self, model: nn.Module, raw_model: WSSSModel, batch: dict, it: int) -> tuple[Tensor, dict]:
        """Total loss of ``batch`` at iteration ``it`` and its unweighted terms (tensors).

        Args:
            model: What runs the forward pass (the DDP wrapper under torchrun, else the model itself).
            raw_model: The bare model (for the CAM pass, which needs no gradient synchronisation).
            batch: ``image``, ``label`` and ``box`` on the device, and optionally ``max_present`` (an int, see
                :func:`pseudo_label_targets`).
            it: The 0-based iteration.
        """
        weights = loss_weights(it, self.cfg.loss)
        with torch.autocast(
            batch["image"].device.type, dtype=torch.bfloat16, enabled=self.amp, cache_enabled=self.autocast_cache
        ):
            out = model(batch["image"])
        dense = weights["seg"] > 0 or weights["reg"] > 0
        targets = self.targets(raw_model, batch) if dense else None
        energy = self.energy if weights["reg"] > 0 else None
        terms = loss_terms(
            out, batch["label"], raw_model.stride, targets, energy, self.cfg.data.ignore_index, self.to_pixels
        )
        loss = total_loss(terms, weights)
        if not dense:  # keep the decoder in the graph so DDP sees a (zero) gradient for every parameter
            loss = loss + 0.0 * out.seg.float().sum()
        return loss, terms
