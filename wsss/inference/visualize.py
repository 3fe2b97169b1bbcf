"""Pictures people would rather look at than read: mask colours, overlays, CAM heatmaps, thumbnails."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw

from wsss.data.classes import voc_palette

_PALETTE = voc_palette()
_BLEND_BAND_PIXELS = 1 << 20
"""Pixels blended per step by :func:`overlay` (bounds its float temporaries on a huge image)."""
TITLE_HEIGHT = 14
"""Pixels of the band above each titled panel (PIL's default font is about 10 px high)."""


def colorize(mask: np.ndarray, palette: np.ndarray = _PALETTE) -> np.ndarray:
    """(H, W) class indices -> (H, W, 3) uint8 colours (VOC palette; 255 = ignore is cream-white)."""
    return palette[np.asarray(mask, dtype=np.uint8)]


def overlay(image: np.ndarray, colours: np.ndarray, alpha: float = 0.5, keep: np.ndarray | None = None) -> np.ndarray:
    """Blend (H, W, 3) uint8 ``colours`` over ``image``; pixels where ``keep`` is True stay untouched. Computed a
    band of rows at a time, so a huge image needs no float copy of itself."""
    out = np.empty_like(image, dtype=np.uint8)
    rows = max(1, _BLEND_BAND_PIXELS // max(1, image.shape[1]))
    for top in range(0, image.shape[0], rows):
        band = slice(top, top + rows)
        blend = image[band].astype(np.float32) * (1 - alpha) + colours[band].astype(np.float32) * alpha
        if keep is not None:
            blend[keep[band]] = image[band][keep[band]]
        out[band] = np.round(blend)
    return out


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


def thumbnail(image: np.ndarray, size: int) -> np.ndarray:
    """(H, W, 3) uint8 image shrunk (PIL's ``thumbnail``, aspect kept) to its longest side at most ``size``."""
    im = Image.fromarray(image)
    im.thumbnail((size, size))
    return np.asarray(im)


def resize_labels(labels: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """(H, W) uint8 class indices resized to ``size`` (h, w) by nearest neighbour: every value is one of the input's."""
    return np.asarray(Image.fromarray(np.asarray(labels, dtype=np.uint8)).resize(size[::-1], Image.NEAREST))


def cam_thumbnails(thumb: np.ndarray, cams: torch.Tensor) -> list[np.ndarray]:
    """One picture per CAM: (K, h, w) CAMs in [0, 1] at the model's resolution, resized (bilinear, antialiased) to
    the (th, tw, 3) uint8 ``thumb``'s size, each as a heatmap blended over it. Never computed at full size."""
    if not len(cams):
        return []
    small = F.interpolate(cams[None].float(), size=thumb.shape[:2], mode="bilinear", align_corners=False,
                          antialias=True)[0]  # fmt: skip
    return [cam_overlay(thumb, plane) for plane in small.clamp(0, 1).cpu().numpy()]


def titled_panels(panels: Sequence[np.ndarray], titles: Sequence[str]) -> np.ndarray:
    """(H, W, 3) uint8 panels side by side, each under a black band with its title in white."""
    columns = []
    for panel, title in zip(panels, titles, strict=True):
        band = Image.new("RGB", (panel.shape[1], TITLE_HEIGHT))
        ImageDraw.Draw(band).text((3, 1), title, fill=(255, 255, 255))
        columns.append(np.concatenate([np.asarray(band), panel], axis=0))
    return np.concatenate(columns, axis=1)
