"""Pseudo labels from CAMs: dual background threshold and PAR refinement (as in ToCo).

For each background value ``t`` (``fg_thresh`` and ``bg_thresh``) a score stack is built per image:
channel 0 is the constant plane ``t``, followed by the CAMs of the classes present in the image
(absent classes take no part). Each stack is resized to ``scale`` times the crop (bilinear), turned
into probabilities by a softmax over its channels, refined by PAR on the image resized the same way,
upsampled back to the crop (bilinear) and reduced by argmax to a class index (0 = background,
``k + 1`` = foreground class ``k``).

The two label maps are combined as: foreground wherever the ``fg_thresh`` stack says foreground
(its class); background only where both stacks say background; ignore where the ``fg_thresh`` stack
says background but the ``bg_thresh`` stack says foreground (the uncertain band). Pixels outside the
valid crop box are ignored.

Images with different class sets are batched by packing each image's present classes into the first
channels of a stack padded to the largest count; padding channels get probability 0 (a logit of
-inf), and PAR and the bilinear resampling keep them at 0, so the result equals a per-image run.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from wsss.cam import scaled_size
from wsss.par import PAR
from wsss.utils.tensors import argmax


def boxes_to_mask(boxes: Tensor, height: int, width: int) -> Tensor:
    """Boolean valid-region masks from crop boxes.

    Args:
        boxes: ``(B, 4)`` integer boxes ``(y0, y1, x0, x1)`` (end exclusive), as the training
            transform returns them.
        height: Mask height.
        width: Mask width.

    Returns:
        ``(B, height, width)`` bool, True inside the box.
    """
    boxes = boxes.to(torch.long)
    ys = torch.arange(height, device=boxes.device)
    xs = torch.arange(width, device=boxes.device)
    in_y = (ys[None] >= boxes[:, 0:1]) & (ys[None] < boxes[:, 1:2])
    in_x = (xs[None] >= boxes[:, 2:3]) & (xs[None] < boxes[:, 3:4])
    return in_y[:, :, None] & in_x[:, None, :]


def _present_keys(labels: Tensor, max_present: int | None) -> Tensor:
    """``(B, K)`` class indices of each stack channel: 0 (background) first, then ``k + 1`` for the
    present classes ``k`` in ascending order, then -1 padding; K = 1 + ``max_present`` (None: the largest class
    count of ``labels``, read from the device)."""
    present = labels.to(torch.bool)
    count = present.sum(dim=1)
    if max_present is None:
        max_present = int(count.max().item()) if present.numel() else 0
    k = 1 + max_present
    # Stable sort puts present classes first, in ascending class order.
    order = torch.sort((~present).to(torch.uint8), dim=1, stable=True).indices
    keys = torch.full((labels.shape[0], k), -1, dtype=torch.long, device=labels.device)
    keys[:, 0] = 0
    if k > 1:
        fg = order[:, : k - 1] + 1
        used = torch.arange(k - 1, device=labels.device)[None] < count[:, None]
        keys[:, 1:] = torch.where(used, fg, torch.full_like(fg, -1))
    return keys


@torch.no_grad()
def refine_cam_stacks(
    images: Tensor,
    cams: Tensor,
    labels: Tensor,
    bg_values: Sequence[float],
    par: PAR,
    scale: float,
    max_present: int | None = None,
) -> tuple[Tensor, Tensor]:
    """The PAR-refined score stacks, one per constant background value, before the argmax of
    :func:`refine_cams_with_par` (its arguments).

    Returns:
        ``(len(bg_values), B, K, H, W)`` float32 refined scores (a view; each pixel's K values sum to
        ``(1 + par.w2) ** par.num_iter``, padding channels hold 0) and the ``(B, K)`` class of each channel: 0
        (background), ``k + 1`` for the present classes ``k`` in ascending order, -1 for padding.
    """
    b, _, h, w = cams.shape
    size = scaled_size(scale, (h, w))
    small_images = F.interpolate(images.float(), size=size, mode="bilinear", align_corners=False)
    small_cams = F.interpolate(cams.float(), size=size, mode="bilinear", align_corners=False)

    keys = _present_keys(labels, max_present)  # (B, K)
    k = keys.shape[1]
    valid = keys >= 0
    gathered = torch.gather(
        small_cams, 1, (keys - 1).clamp(min=0)[:, :, None, None].expand(b, k, *size)
    )  # (B, K, h', w'); channel 0 and padding are overwritten below
    stacks = []
    for value in bg_values:
        stack = gathered.clone()
        stack[:, 0] = value
        stack = stack.masked_fill(~valid[:, :, None, None], float("-inf"))
        stacks.append(stack.softmax(dim=1))
    refined = par(small_images, torch.cat(stacks, dim=1))
    refined = F.interpolate(refined, size=(h, w), mode="bilinear", align_corners=False)
    return refined.view(b, len(bg_values), k, h, w).transpose(0, 1), keys


@torch.no_grad()
def refine_cams_with_par(
    images: Tensor,
    cams: Tensor,
    labels: Tensor,
    bg_values: Sequence[float],
    par: PAR,
    scale: float,
    max_present: int | None = None,
) -> Tensor:
    """PAR-refined label maps, one per constant background value.

    Args:
        images: De-normalised images ``(B, 3, H, W)`` in [0, 1] (PAR's guidance).
        cams: CAMs ``(B, C-1, H, W)`` in [0, 1].
        labels: Multi-hot image labels ``(B, C-1)``; only present classes can be predicted.
        bg_values: Background plane values, one label map each (the PAR affinity is shared).
        par: The refinement module.
        scale: Resolution of the refinement relative to the crop (:func:`wsss.cam.scaled_size`: ``int(scale * H)``,
            at least 1).
        max_present: The largest number of classes present in one image of the batch, when the caller knows
            it without asking the device (counted on the host's labels: the training step); None counts it
            from ``labels``, which waits for the device.

    Returns:
        Long label maps ``(len(bg_values), B, H, W)``, 0 = background, ``k + 1`` = class ``k``.
    """
    return stack_labels(*refine_cam_stacks(images, cams, labels, bg_values, par, scale, max_present))


def stack_labels(scores: Tensor, keys: Tensor) -> Tensor:
    """The class of each pixel's largest refined score, ``(S, B, H, W)`` long, from the ``(S, B, K, H, W)`` stacks and
    ``(B, K)`` channel classes of :func:`refine_cam_stacks` (padding channels never win)."""
    s, b, _, h, w = scores.shape
    padding = (keys < 0)[:, :, None, None]
    out = [torch.gather(keys, 1, argmax(stack.masked_fill(padding, float("-inf")), 1).flatten(1)) for stack in scores]
    return torch.stack(out).view(s, b, h, w)


@torch.no_grad()
def pseudo_labels(
    images: Tensor,
    cams: Tensor,
    labels: Tensor,
    valid_mask: Tensor | None,
    par: PAR,
    fg_thresh: float,
    bg_thresh: float,
    scale: float,
    ignore_index: int,
    max_present: int | None = None,
) -> Tensor:
    """Dual-threshold PAR-refined pseudo labels.

    Args:
        images: De-normalised images ``(B, 3, H, W)`` in [0, 1].
        cams: CAMs ``(B, C-1, H, W)`` in [0, 1] (see :func:`wsss.cam.multiscale_cam`).
        labels: Multi-hot image labels ``(B, C-1)``.
        valid_mask: ``(B, H, W)`` bool, True inside the valid crop box (:func:`boxes_to_mask`), or
            None when the whole crop is valid.
        par: The refinement module.
        fg_thresh: Background plane of the foreground stack: a class must beat it to be foreground.
        bg_thresh: Background plane of the background stack: pixels where even this plane wins (and
            the foreground stack agrees) are background.
        scale: Resolution of the refinement relative to the crop.
        ignore_index: Label of uncertain and out-of-box pixels.
        max_present: See :func:`refine_cams_with_par`.

    Returns:
        Long labels ``(B, H, W)``: 0 = background, ``k + 1`` = class ``k``, ``ignore_index`` elsewhere.
    """
    high, low = refine_cams_with_par(images, cams, labels, (fg_thresh, bg_thresh), par, scale, max_present)
    return combine_dual_threshold(high, low, valid_mask, ignore_index)


def combine_dual_threshold(high: Tensor, low: Tensor, valid_mask: Tensor | None, ignore_index: int) -> Tensor:
    """Pseudo labels from the refined label maps of the ``fg_thresh`` (``high``) and ``bg_thresh`` (``low``)
    stacks, each ``(B, H, W)``: foreground where ``high`` says so, background where both say background,
    ``ignore_index`` elsewhere and outside ``valid_mask`` (``(B, H, W)`` bool, or None)."""
    out = torch.where(high > 0, high, torch.full_like(high, ignore_index))
    out = torch.where((high == 0) & (low == 0), torch.zeros_like(out), out)
    if valid_mask is not None:
        out = out.masked_fill(~valid_mask.to(torch.bool), ignore_index)
    return out
