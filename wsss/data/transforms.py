"""Image preprocessing: normalisation constants from timm, training augmentation with albumentations."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import albumentations as A
import albumentations.augmentations.geometric.functional as fgeometric
import cv2
import numpy as np
import torch

from wsss.cam import scaled_size
from wsss.config import DataConfig
from wsss.utils.tensors import to_device


def backbone_mean_std(backbone: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Normalisation mean and std (RGB, 0-1 scale) from the timm pretrained config of ``backbone``.

    The single place preprocessing constants come from (STYLE rule 9).
    """
    import timm

    cfg = timm.get_pretrained_cfg(backbone)
    if cfg is None:
        raise ValueError(f"timm has no model named '{backbone}'; see timm.list_models()")
    return tuple(float(m) for m in cfg.mean), tuple(float(s) for s in cfg.std)


def normalize(
    image: np.ndarray,
    mean: Sequence[float] | torch.Tensor,
    std: Sequence[float] | torch.Tensor,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """(H, W, 3) uint8 RGB in any memory layout, read-only too -> (3, H, W) float32 normalised tensor on ``device``.

    The uint8 pixels go to ``device`` (a quarter of the float's bytes) without making the host wait for it
    (:func:`~wsss.utils.tensors.to_device`), and are converted there. torch wraps the caller's array only when it is
    writable and C-contiguous (a read-only one, e.g. ``np.asarray(pil_image)``, would make torch warn); another is
    copied first. ``mean`` and ``std`` as values, or as :func:`channel_constants` on ``device`` (no upload per
    image).
    """
    if not (image.flags.writeable and image.flags.c_contiguous):
        image = np.array(image, order="C")  # a copy
    pixels = to_device(torch.from_numpy(image), device)
    x = pixels.permute(2, 0, 1).float().div_(255.0)
    m = (mean if isinstance(mean, torch.Tensor) else channel_constants(mean, x.device)).view(3, 1, 1)
    s = (std if isinstance(std, torch.Tensor) else channel_constants(std, x.device)).view(3, 1, 1)
    return (x - m) / s


def denormalize(
    x: torch.Tensor, mean: Sequence[float] | torch.Tensor, std: Sequence[float] | torch.Tensor
) -> torch.Tensor:
    """(B, 3, H, W) normalised -> (B, 3, H, W) in [0, 1] (the inverse of :func:`normalize`).

    ``mean`` and ``std`` as values (uploaded at every call), or as :func:`channel_constants` on ``x``'s device, made
    once.
    """
    m = mean if isinstance(mean, torch.Tensor) else channel_constants(mean, x.device)
    s = std if isinstance(std, torch.Tensor) else channel_constants(std, x.device)
    return (x * s.to(x.dtype) + m.to(x.dtype)).clamp_(0.0, 1.0)


def channel_constants(values: Sequence[float], device: torch.device | str) -> torch.Tensor:
    """``values`` as a ``(1, C, 1, 1)`` float32 tensor on ``device``, to broadcast over ``(B, C, H, W)``, copied
    there without making the host wait (:func:`~wsss.utils.tensors.to_device`)."""
    return to_device(torch.tensor(tuple(values), dtype=torch.float32).view(1, len(values), 1, 1), device)


def normalization_table(mean: Sequence[float], std: Sequence[float]) -> np.ndarray:
    """(3, 256) float32: the value :class:`TrainAugment`'s normalisation (albumentations' ``Normalize``, which looks
    uint8 pixels up in a table of its own) gives each pixel level of each channel, read from ``Normalize`` itself."""
    levels = np.repeat(np.arange(256, dtype=np.uint8)[None, :, None], 3, axis=2)  # (1, 256, 3): every level
    normalized = A.Normalize(mean=mean, std=std, max_pixel_value=255.0)(image=levels)["image"]
    return np.ascontiguousarray(normalized[0].astype(np.float32).T)


class PixelNormalize:
    """(..., 3, H, W) uint8 pixels -> float32, normalised by :func:`normalization_table` on their device: bit for bit
    what :class:`TrainAugment` makes of them on the host, from a quarter of the bytes. The training loader ships the
    uint8 crops, and the step's device normalises them (docs/benchmarks.md, "The training loader alone").

    The table is copied to ``device`` once, when made (without making the host wait,
    :func:`~wsss.utils.tensors.to_device`)."""

    def __init__(self, mean: Sequence[float], std: Sequence[float], device: torch.device | str = "cpu") -> None:
        table = torch.from_numpy(normalization_table(mean, std))
        self.table = to_device(table.flatten(), device)
        self.offsets = to_device(torch.arange(0, table.numel(), table.shape[1]).view(3, 1, 1), device)
        """Each channel's start in the flattened table."""

    def __call__(self, pixels: torch.Tensor) -> torch.Tensor:
        if pixels.dtype != torch.uint8 or pixels.ndim < 3 or pixels.shape[-3] != 3:
            raise ValueError(f"PixelNormalize takes (..., 3, H, W) uint8 pixels, got {pixels.dtype} "
                             f"{tuple(pixels.shape)}")  # fmt: skip
        return torch.take(self.table, pixels.long().add_(self.offsets))


@dataclass
class Sample:
    """One augmented training crop."""

    image: np.ndarray
    """(crop, crop, 3) float32, normalised (:meth:`TrainAugment.__call__`), or its uint8 pixels
    (:meth:`TrainAugment.pixels`); padding is ``DataConfig.pad_rgb`` before the colour augmentation."""
    mask: np.ndarray
    """(crop, crop) uint8 class indices; padding is the ignore index."""
    box: np.ndarray
    """(4,) int64 ``[y0, y1, x0, x1]`` (end exclusive): where the crop holds image pixels."""


class RandomScaleKeepingPixels(A.RandomScale):
    """``A.RandomScale`` (the same random draw, the same pixels) whose output keeps at least one pixel per side:
    an image of 1x1 or 10000x1 pixels scaled by 0.5 is 1x1 or 5000x1, as :func:`wsss.cam.scaled_size` sizes the
    CAM and inference scales, where albumentations asks OpenCV for 0 pixels (``cv2.error`` in resize)."""

    def apply(self, img: np.ndarray, scale: float, **params: Any) -> np.ndarray:
        return self._scale(img, scale, self.interpolation)

    def apply_to_mask(self, mask: np.ndarray, scale: float, **params: Any) -> np.ndarray:
        return self._scale(mask, scale, self.mask_interpolation)

    @staticmethod
    def _scale(array: np.ndarray, scale: float, interpolation: int) -> np.ndarray:
        height, width = scaled_size(scale, array.shape[:2])
        return fgeometric.resize(array, (height, width), interpolation)


class TrainAugment:
    """Training augmentation in the reference's order (docs/design.md section 3), reproducible from an integer seed.

    Geometry first, on the uint8 image: random scale, horizontal flip, padding with ``pad_rgb`` to the crop
    size at a random position, random crop. Then, on the crop (padding included): colour jitter, grayscale,
    Gaussian blur, all uint8 still (:meth:`pixels`); then normalisation (:meth:`__call__`; albumentations'
    ``Normalize``, or its table on the device, :class:`PixelNormalize`). The mask follows every geometric step (nearest
    interpolation, padded with the ignore index). The valid box is tracked as a third target so it is exact after
    scale, flip, pad and crop. (The reference also flips the crop a second time without flipping its box; here the
    box always matches the pixels.)
    """

    def __init__(self, cfg: DataConfig, mean: tuple[float, ...], std: tuple[float, ...]):
        crop = cfg.crop_size
        lo, hi = cfg.scale_range
        b, c, s, h = cfg.color_jitter
        self.transform = A.Compose(
            [
                RandomScaleKeepingPixels(
                    scale_limit=(lo - 1.0, hi - 1.0),
                    interpolation=cv2.INTER_LINEAR,
                    mask_interpolation=cv2.INTER_NEAREST,
                    p=1.0,
                ),
                A.HorizontalFlip(p=cfg.hflip_prob),
                A.PadIfNeeded(
                    min_height=crop,
                    min_width=crop,
                    position="random",
                    border_mode=cv2.BORDER_CONSTANT,
                    fill=tuple(cfg.pad_rgb),
                    fill_mask=cfg.ignore_index,
                ),
                A.RandomCrop(height=crop, width=crop),
                A.ColorJitter(brightness=b, contrast=c, saturation=s, hue=h, p=cfg.color_jitter_prob),
                A.ToGray(p=cfg.grayscale_prob),
                A.GaussianBlur(blur_limit=0, sigma_limit=cfg.blur_sigma, p=cfg.blur_prob),
            ],
            additional_targets={"valid": "mask"},
        )
        self.table = normalization_table(mean, std)

    def __call__(self, image: np.ndarray, mask: np.ndarray | None, seed: int) -> Sample:
        """Augment (H, W, 3) uint8 ``image`` and optional (H, W) ``mask`` with randomness from ``seed``; the crop
        normalised."""
        sample = self.pixels(image, mask, seed)
        return Sample(image=self.table[np.arange(3), sample.image], mask=sample.mask, box=sample.box)

    def pixels(self, image: np.ndarray, mask: np.ndarray | None, seed: int) -> Sample:
        """:meth:`__call__`'s crop before its normalisation: (crop, crop, 3) uint8."""
        if mask is None:
            mask = np.zeros(image.shape[:2], dtype=np.uint8)
        # Valid pixels are 1; padding becomes the ignore index like the mask's, so one fill serves both.
        valid = np.ones(image.shape[:2], dtype=np.uint8)
        self.transform.set_random_seed(seed)
        out = self.transform(image=image, mask=mask, valid=valid)
        rows = np.flatnonzero((out["valid"] == 1).any(axis=1))
        cols = np.flatnonzero((out["valid"] == 1).any(axis=0))
        box = np.array([rows[0], rows[-1] + 1, cols[0], cols[-1] + 1], dtype=np.int64)
        return Sample(image=out["image"], mask=out["mask"], box=box)
