"""Class activation maps: multi-scale, flip-augmented, normalised per image and class.

One function, :func:`multiscale_cam`, serves training (the no-grad CAM pass that feeds the pseudo
labels), validation and CAM export. :func:`cam_to_label` turns CAMs into a label map with a single
background threshold (validation and inference of the CAM branch).

Order of operations per scale (as in the ToCo release): resize the image, run it batched with its
horizontal flip, un-flip, upsample both to the input size, take the elementwise max of the two, ReLU.
The per-scale maps are summed, then each (image, class) plane is min-max normalised to [0, 1] and the
planes of absent classes are zeroed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

NORM_EPS = 1e-5
"""Added to the (max - min) denominator of the per-plane normalisation, as in ToCo."""


def scaled_size(scale: float, size: Sequence[int]) -> tuple[int, int]:
    """``(int(scale * H), int(scale * W))`` of ``size = (H, W)``, each side at least one pixel (a 1x1 image at
    scale 0.5 stays 1x1): the size of an image at a CAM, inference or training scale."""
    return max(1, int(scale * size[0])), max(1, int(scale * size[1]))


@torch.no_grad()
def multiscale_cam(
    cam_fn: Callable[[Tensor], Tensor],
    images: Tensor,
    labels: Tensor,
    scales: Sequence[float],
    flip: bool = True,
    one_image_at_a_time: bool = False,
) -> Tensor:
    """Multi-scale (and flipped) CAMs, min-max normalised per image and class.

    Args:
        cam_fn: Maps an image batch ``(N, 3, h, w)`` to raw CAMs ``(N, C-1, h', w')`` whose extent is
            exactly the input (:meth:`wsss.models.WSSSModel.cam`: the token grid, or pixels where the input
            was padded to the patch size). Called as is: the caller chooses train/eval mode.
        images: Normalised images ``(B, 3, H, W)``.
        labels: Multi-hot image labels ``(B, C-1)`` (foreground classes only).
        scales: Image scales; each resized to :func:`scaled_size` (bilinear, ``align_corners=False``).
        flip: Also run the horizontal flip of every scale and take the max with the un-flipped map.
        one_image_at_a_time: Bring each scale's maps to full size one image (and its flip) at a time, into the
            output: the same numbers to the bit, the memory of the output and one image's maps instead of the
            batch's ``2B`` full-size maps at once (a batch of 16 COCO images: 80 classes at 640 x 480, 3.1 GB per
            scale), for more launches (the tools' exports and evaluations; the training step's crops are small).

    Returns:
        CAMs ``(B, C-1, H, W)`` in ``[0, 1]`` (float32), zero for absent classes. A plane is
        ``(x - min) / (max - min + 1e-5)`` of the ReLU'd sum over scales.
    """
    if not scales:
        raise ValueError("multiscale_cam needs at least one scale")
    b, _, h, w = images.shape
    total = None
    for s in scales:
        size = scaled_size(s, (h, w))
        x = images if size == (h, w) else F.interpolate(images, size=size, mode="bilinear", align_corners=False)
        if flip:
            x = torch.cat([x, x.flip(-1)], dim=0)
        small = cam_fn(x).float()
        if one_image_at_a_time:
            total = small.new_zeros(b, small.shape[1], h, w) if total is None else total
            for i in range(b):  # rows i and b + i: the image and its flip
                total[i] += _full_size(small[i :: b] if flip else small[i : i + 1], (h, w), flip)[0]
        else:
            cam = _full_size(small, (h, w), flip)
            total = cam if total is None else total + cam
    total = normalize_cams(total, inplace=True)  # no second copy of the batch's maps
    return total.mul_(labels.to(total.dtype)[:, :, None, None])


def _full_size(maps: Tensor, size: tuple[int, int], flip: bool) -> Tensor:
    """``(N, K, h', w')`` maps (with ``flip``, the N/2 images then their flips) brought to ``size``, each image's max
    with its un-flipped flip, ReLU'd: ``(N or N/2, K, H, W)``."""
    cam = F.interpolate(maps, size=size, mode="bilinear", align_corners=False)
    if flip:
        half = cam.shape[0] // 2
        cam = torch.maximum(cam[:half], cam[half:].flip(-1))
    return F.relu(cam)


def normalize_cams(cams: Tensor, inplace: bool = False) -> Tensor:
    """Min-max normalise each (image, class) plane of ``cams`` (B, K, H, W) to [0, 1]:
    ``(x - min) / (max - min + 1e-5)``; with ``inplace`` into ``cams`` (the same numbers)."""
    flat = cams.flatten(2)
    low = flat.amin(dim=2)[:, :, None, None]
    high = flat.amax(dim=2)[:, :, None, None]
    if inplace:
        return cams.sub_(low).div_(high - low + NORM_EPS)
    return (cams - low) / (high - low + NORM_EPS)


def labels_from_mask(mask: Tensor, num_classes: int) -> Tensor:
    """(H, W) class indices -> (C-1,) float multi-hot of the foreground classes present (255 ignored).

    Validation and CAM evaluation take image-level labels from the ground truth, as the WSSS literature does.
    """
    present = torch.zeros(num_classes, dtype=torch.float32, device=mask.device)
    present[mask[mask < num_classes].unique()] = 1.0
    return present[1:]


def cam_to_label(cam: Tensor, labels: Tensor, bg_thresh: float) -> Tensor:
    """Label map from CAMs with a constant background plane.

    Equivalent to the argmax over ``[bg_thresh, cam_1, ..., cam_{C-1}]``: a pixel is background (0)
    when the largest present-class CAM is ``<= bg_thresh`` (ties go to background), otherwise
    ``1 + argmax`` over the present classes.

    Args:
        cam: CAMs ``(B, C-1, H, W)`` in [0, 1].
        labels: Multi-hot image labels ``(B, C-1)``; absent classes are never predicted.
        bg_thresh: The background score.

    Returns:
        Long label map ``(B, H, W)`` with 0 = background and ``k + 1`` for foreground class ``k``.
    """
    present = labels.to(torch.bool)[:, :, None, None]
    masked = cam.masked_fill(~present, float("-inf"))
    value, index = masked.max(dim=1)
    return torch.where(value > bg_thresh, index + 1, torch.zeros_like(index))
