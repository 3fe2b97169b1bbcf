"""Pictures people would rather look at than read: mask colours, overlays, CAM heatmaps."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from PIL import Image, ImageDraw

from wsss.data.classes import voc_palette

_PALETTE = voc_palette()
TITLE_HEIGHT = 14
"""Pixels of the band above each titled panel (PIL's default font is about 10 px high)."""


def colorize(mask: np.ndarray, palette: np.ndarray = _PALETTE) -> np.ndarray:
    """(H, W) class indices -> (H, W, 3) uint8 colours (VOC palette; 255 = ignore is cream-white)."""
    return palette[np.asarray(mask, dtype=np.uint8)]


def overlay(image: np.ndarray, colours: np.ndarray, alpha: float = 0.5, keep: np.ndarray | None = None) -> np.ndarray:
    """Blend (H, W, 3) uint8 ``colours`` over ``image``; pixels where ``keep`` is True stay untouched."""
    out = image.astype(np.float32) * (1 - alpha) + colours.astype(np.float32) * alpha
    if keep is not None:
        out[keep] = image[keep]
    return np.round(out).astype(np.uint8)


def mask_overlay(image: np.ndarray, mask: np.ndarray, alpha: float = 0.5) -> np.ndarray:
    """Image with its label map blended on top; background (0) pixels left as they are."""
    return overlay(image, colorize(mask), alpha, keep=np.asarray(mask) == 0)


def heatmap(cam: np.ndarray) -> np.ndarray:
    """(H, W) values in [0, 1] -> (H, W, 3) uint8 'jet' colours."""
    from matplotlib import colormaps

    rgba = colormaps["jet"](np.clip(np.asarray(cam, dtype=np.float32), 0.0, 1.0))
    return np.round(rgba[..., :3] * 255).astype(np.uint8)


def cam_overlay(image: np.ndarray, cam: np.ndarray, alpha: float = 0.5) -> np.ndarray:
    """Image with the CAM's heatmap blended on top; ``cam`` is (H, W) or (K, H, W) (max taken)."""
    cam = np.asarray(cam)
    if cam.ndim == 3:
        cam = cam.max(axis=0) if cam.shape[0] else np.zeros(cam.shape[1:], np.float32)
    return overlay(image, heatmap(cam), alpha)


def titled_panels(panels: Sequence[np.ndarray], titles: Sequence[str]) -> np.ndarray:
    """(H, W, 3) uint8 panels side by side, each under a black band with its title in white."""
    columns = []
    for panel, title in zip(panels, titles, strict=True):
        band = Image.new("RGB", (panel.shape[1], TITLE_HEIGHT))
        ImageDraw.Draw(band).text((3, 1), title, fill=(255, 255, 255))
        columns.append(np.concatenate([np.asarray(band), panel], axis=0))
    return np.concatenate(columns, axis=1)
