"""Test-time augmentation: multi-scale + flip segmentation logits, classifier logits and CAMs of a batch.

DESIGN.md section 3, "inference" (docs/design.md): per scale ``s`` the image is resized to
:func:`wsss.cam.scaled_size` (bilinear, ``align_corners=False``, the rule of :func:`wsss.cam.multiscale_cam`),
run batched with its horizontal flip, the stride-16 logits are brought to the scaled image's extent with
:func:`~wsss.models.segmentor.maps_to_pixels` (exact patch alignment, padding cropped), resized to ``(H, W)``,
the flipped half un-flipped, and the two summed; the result is the elementwise max over scales.

The model runs a scale's whole batch (and its flips) in one pass; its token-grid maps are then brought to full size
one image (and its flip) at a time, into the outputs: the transient full-size maps are one image's at a time, not the
batch's (at 3 scales + flip, 81 classes and 640 x 480 they were about 0.6 GB per image of the batch), and the numbers
are the same to the bit (``tests/models/test_tta.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from wsss.cam import normalize_cams, scaled_size
from wsss.models.segmentor import maps_to_pixels

__all__ = ["TTAOutput", "predict_logits", "predicted_classes", "tta_forward"]


@dataclass
class TTAOutput:
    """What :func:`tta_forward` returns for a batch of B images of size (H, W).

    Attributes:
        seg: (B, C, H, W) segmentation logits, summed over the flip, max over scales.
        cls_logits: (B, C-1) classifier logits, averaged over every scale and flip pass.
        cam: (B, C-1, H, W) CAMs in [0, 1] of every foreground class (ReLU of the max over the flip, summed
            over scales, min-max normalised per plane as :func:`wsss.cam.multiscale_cam`, but at the
            inference scales and not zeroed for absent classes), or None unless requested.
    """

    seg: Tensor
    cls_logits: Tensor
    cam: Tensor | None = None


@torch.no_grad()
def tta_forward(
    model: torch.nn.Module,
    images: Tensor,
    scales: Sequence[float],
    flip: bool,
    cams: bool = False,
) -> TTAOutput:
    """Multi-scale (and flipped) segmentation logits of a batch of same-size images, in one pass per scale.

    Args:
        model: A :class:`~wsss.models.segmentor.WSSSModel` (anything whose ``forward`` returns ``seg`` at
            ``model.stride``, ``logits`` and, for ``cams``, ``features`` for ``model.classifier.cam``), in
            eval mode.
        images: (B, 3, H, W) normalised images.
        scales: Image scales; the size at scale ``s`` is :func:`wsss.cam.scaled_size`.
        flip: Also run every scale's horizontal flip (batched with it) and sum the un-flipped logits.
        cams: Also compute the CAMs from the same passes.

    Returns:
        :class:`TTAOutput`, float32 on the images' device.
    """
    if not scales:
        raise ValueError("tta_forward needs at least one scale")
    b, _, h, w = images.shape
    seg_max = cam_sum = None
    cls_sum = 0.0
    passes = 0
    for k, s in enumerate(scales):
        first = k == 0
        size = scaled_size(s, (h, w))
        x = images if size == (h, w) else F.interpolate(images, size=size, mode="bilinear", align_corners=False)
        if flip:
            x = torch.cat([x, x.flip(-1)], dim=0)
        out = model(x)
        logits = out.logits.float()
        cls_sum = cls_sum + (logits[:b] + logits[b:] if flip else logits)
        passes += 2 if flip else 1
        seg = out.seg.float()
        cam = model.classifier.cam(out.features).float() if cams else None
        if first:
            seg_max = seg.new_empty(b, seg.shape[1], h, w)
            cam_sum = None if cam is None else cam.new_empty(b, cam.shape[1], h, w)
        # one image (and its flip) at a time: the full-size maps of one image at a time, not of the whole batch
        for i in range(b):
            pixels = _image_pixels(seg, i, b, flip, size, model.stride, (h, w), torch.add)
            _fold(seg_max[i : i + 1], pixels, first, torch.maximum)
            if cam is not None:
                pixels = F.relu(_image_pixels(cam, i, b, flip, size, model.stride, (h, w), torch.maximum))
                _fold(cam_sum[i : i + 1], pixels, first, torch.add)
    if cam_sum is not None:
        cam_sum = normalize_cams(cam_sum)
    return TTAOutput(seg=seg_max, cls_logits=cls_sum / passes, cam=cam_sum)


def _fold(total: Tensor, part: Tensor, first: bool, combine) -> None:
    """``total = part`` at the first scale, else ``combine(total, part)``, in place."""
    if first:
        total.copy_(part)
    else:
        combine(total, part, out=total)


def _image_pixels(maps: Tensor, i: int, b: int, flip: bool, size: tuple[int, int], stride: int,
                  out_size: tuple[int, int], combine) -> Tensor:  # fmt: skip
    """Image ``i``'s (1, K, H, W) maps of one scale from the batch's token-grid ``maps`` ((2B or B, K, h, w): the
    flipped images' after the B others): brought to the scaled image's extent and to ``out_size``
    (:func:`~wsss.models.segmentor.maps_to_pixels`), its flip's un-flipped and joined to them by ``combine``."""
    pixels = maps_to_pixels(maps[i : i + 1], size, stride, out_size)
    if not flip:
        return pixels
    return combine(pixels, maps_to_pixels(maps[b + i : b + i + 1], size, stride, out_size).flip(-1))


def predict_logits(
    model: torch.nn.Module, image: Tensor, scales: Sequence[float], flip: bool
) -> Tensor:
    """TTA segmentation logits: (B, 3, H, W) normalised images (B = 1 usually) -> (B, C, H, W) float32.

    Per scale: resize, run batched with the flip, un-flip, sum over the flip, resize to (H, W); then the
    max over scales. See :func:`tta_forward`.
    """
    return tta_forward(model, image, scales, flip).seg


def predicted_classes(cls_logits: Tensor, threshold: float) -> tuple[Tensor, Tensor]:
    """(..., C-1) classifier logits -> ((..., C-1) bool: the foreground classes to show; (...) bool: whether they
    are the top-1 fallback because no class passes ``sigmoid > threshold``). Computed where the logits are, without
    reading them on the host."""
    present = cls_logits.sigmoid() > threshold
    top1 = ~present.any(dim=-1)
    top = F.one_hot(cls_logits.argmax(dim=-1), cls_logits.shape[-1]).bool()
    return torch.where(top1[..., None], top, present), top1
