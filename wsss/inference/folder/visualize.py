"""Pictures people would rather look at than read: mask colours, overlays, CAM heatmaps, thumbnails."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw, ImageFont

from wsss.data.classes import voc_palette

_PALETTE = voc_palette()
_BLEND_BAND_PIXELS = 1 << 20
"""Pixels blended per step by :func:`overlay` (bounds its float temporaries on a huge image)."""
TITLE_HEIGHT = 14
"""Pixels of the band above each titled panel (PIL's default font is about 10 px high)."""
LEGEND_FONT = (12, 1 / 40, 120)
"""The text of a full-size CAM picture's legend: 1/40 of the image's width, within 12 to 120 px."""
LEGEND_BAR = 12
"""The legend's colour bar is at most this many text heights long."""


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


@dataclass
class CamLegend:
    """What a full-size CAM picture (``cams/<image>.jpg`` of ``tools/infer.py --cams``) shows besides the heatmap:
    a band above it naming the classes the heatmap is the max of, with their scores, and the colour scale; and each
    class's name at its CAM's peak. :func:`cam_legend` lays it out, :func:`draw_cam_legend` draws it.

    Attributes:
        font_size: Pixels of the text (grows with the width, so the band reads the same on any image).
        lines: The band's text: a title, then each class with its score, wrapped to the width.
        bar: (x0, y0, x1, y1) of the colour bar in the band: the heatmap's colours from 0 (left) to 1 (right).
        ticks: (x, text) of the bar's labels, centred on x.
        peaks: (name, x, y, (r, g, b)): each class's name, its box at (x, y) in image pixels (its CAM's maximum) in
            the class's mask colour.
        height: Rows of the band.
    """

    font_size: int
    lines: list[str]
    bar: tuple[int, int, int, int]
    ticks: list[tuple[int, str]]
    peaks: list[tuple[str, int, int, tuple[int, int, int]]]
    height: int


def legend_font(size: int) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    """The font of :class:`CamLegend` at ``size`` pixels (Pillow's own, no font file needed)."""
    return ImageFont.load_default(size=size)


def cam_peaks(cams: torch.Tensor, size: tuple[int, int]) -> list[tuple[int, int]]:
    """(y, x) in an image of ``size`` (H, W) of the maximum of each of the (K, h, w) CAMs at the model's resolution:
    the centre of the maximum's cell, scaled to the image."""
    h, w = cams.shape[-2:]
    cells = cams.flatten(1).argmax(dim=1).tolist()
    return [(min(size[0] - 1, int((c // w + 0.5) * size[0] / h)), min(size[1] - 1, int((c % w + 0.5) * size[1] / w)))
            for c in cells]  # fmt: skip


def _wrap(pieces: Sequence[str], sep: str, fits) -> list[str]:
    """``pieces`` joined by ``sep`` into lines that ``fits`` (a piece wider than a line gets a line of its own); a
    wrapped line keeps the separator's mark (``", "`` -> ``","``), so joining the lines with spaces gives the text."""
    lines, line = [], ""
    for piece in pieces:
        joined = f"{line}{sep}{piece}" if line else piece
        if line and not fits(joined + sep.strip()):
            lines.append(line + sep.strip())
            joined = piece
        line = joined
    return [*lines, line]


def cam_legend(
    width: int,
    names: Sequence[str],
    scores: Sequence[float],
    peaks: Sequence[tuple[int, int]],
    indices: Sequence[int],
) -> CamLegend:
    """Lay out the legend of a full-size CAM picture ``width`` pixels wide (:class:`CamLegend`).

    Args:
        width: The image's width.
        names: The K classes the heatmap is the max of.
        scores: Their image-level probabilities.
        peaks: (y, x) of each class's CAM maximum, in image pixels.
        indices: Their class indices (the mask colours of their names' boxes).
    """
    low_px, per_width, high_px = LEGEND_FONT
    size = min(max(low_px, int(width * per_width)), high_px)
    font, pad = legend_font(size), max(2, size // 3)
    draw = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    items = [f"{name} {score:.2f}" for name, score in zip(names, scores, strict=True)] or ["no class"]

    def fits(text: str) -> bool:
        return draw.textlength(text, font=font) <= width - 2 * pad

    lines = _wrap("CAM: the max over the present classes".split(), " ", fits)
    lines += _wrap(items, ", ", fits)
    top = pad + len(lines) * (size + pad)
    low, high = draw.textlength("0", font=font), draw.textlength("1", font=font)
    x0 = pad + round(low) + pad
    x1 = max(x0 + 1, min(width - pad - round(high) - pad, x0 + LEGEND_BAR * size))
    bar = (x0, top, x1, top + size)
    ticks = [(pad + round(low / 2), "0"), (x1 + pad + round(high / 2), "1")]
    placed = [(name, int(x), int(y), tuple(int(v) for v in _PALETTE[k]))
              for name, (y, x), k in zip(names, peaks, indices, strict=True)]  # fmt: skip
    return CamLegend(size, lines, bar, ticks, placed, top + size + pad)


def draw_cam_legend(picture: np.ndarray, legend: CamLegend) -> None:
    """Draw ``legend`` on ``picture``, (legend.height + H, W, 3) uint8 whose rows below the band hold the heatmap:
    the band's text and colour bar, and each peak's name in a box of its class colour (drawn on small crops, so a
    huge picture is never copied)."""
    font, size = legend_font(legend.font_size), legend.font_size
    pad = max(2, size // 3)
    band = Image.new("RGB", (picture.shape[1], legend.height), (0, 0, 0))
    draw = ImageDraw.Draw(band)
    for row, text in enumerate(legend.lines):
        draw.text((pad, pad + row * (size + pad)), text, fill=(255, 255, 255), font=font)
    x0, y0, x1, y1 = legend.bar
    colours = heatmap(np.linspace(0.0, 1.0, x1 - x0)[None])[0]
    for x, colour in enumerate(colours):
        draw.line([(x0 + x, y0), (x0 + x, y1 - 1)], fill=tuple(int(v) for v in colour))
    for x, text in legend.ticks:
        draw.text((x, (y0 + y1) // 2), text, fill=(255, 255, 255), font=font, anchor="mm")
    picture[: legend.height] = np.asarray(band)
    height, width = picture.shape[0] - legend.height, picture.shape[1]
    for name, x, y, colour in legend.peaks:
        box_w = round(draw.textlength(name, font=font)) + 2 * pad
        box_h = size + 2 * pad
        left = min(max(0, x - box_w // 2), max(0, width - box_w))
        top = min(max(0, y - box_h // 2), max(0, height - box_h)) + legend.height
        crop = picture[top : top + box_h, left : left + box_w]
        label = Image.fromarray(np.ascontiguousarray(crop))
        ink = (0, 0, 0) if sum(colour) > 382 else (255, 255, 255)
        ImageDraw.Draw(label).rectangle([0, 0, box_w - 1, box_h - 1], fill=colour, outline=ink)
        ImageDraw.Draw(label).text((pad, pad), name, fill=ink, font=font)
        crop[...] = np.asarray(label)
