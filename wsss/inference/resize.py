"""Bilinear resizing (``align_corners=False``) a band of rows at a time: the full-size float maps of a large image
never exist, only its bands (:class:`BandResize`). The predictor brings the model's outputs back to the image's size
with it, and the dense CRF its marginals when it ran at a reduced resolution."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["BandResize", "interpolation_matrix", "row_bands", "shrink"]

_MATRIX_CHUNK = 256
"""Unit vectors resized per call when building an interpolation matrix (bounds its temporary memory)."""


def row_bands(height: int, width: int, band_pixels: int) -> Iterator[tuple[int, int]]:
    """``(start, stop)`` of bands of rows of at most about ``band_pixels`` pixels covering ``height`` rows (0: one
    band)."""
    rows = max(1, band_pixels // width) if band_pixels else height
    for start in range(0, height, rows):
        yield start, min(start + rows, height)


def shrink(
    band: Callable[[int, int], Tensor], source: tuple[int, int], size: tuple[int, int], band_pixels: int
) -> Tensor:
    """(1, C, h, w) maps of (H, W) = ``source`` pixels resized down to ``size`` (bilinear, antialiased): the width of
    each band of rows of about ``band_pixels`` pixels, which ``band(start, stop)`` gives as (1, C, rows, W) floats,
    then the height of the narrow maps. Equals ``F.interpolate`` of the whole maps up to float rounding, and the
    full-size float maps never exist."""
    narrow = [
        F.interpolate(band(start, stop), size=(stop - start, size[1]), mode="bilinear", align_corners=False,
                      antialias=True)
        for start, stop in row_bands(*source, band_pixels)
    ]  # fmt: skip
    return F.interpolate(torch.cat(narrow, dim=-2), size=size, mode="bilinear", align_corners=False, antialias=True)


def interpolation_matrix(size_in: int, size_out: int, antialias: bool, device: torch.device) -> Tensor:
    """(size_out, size_in) float32 weights of 1-D bilinear resizing as ``F.interpolate`` (``align_corners=False``,
    with or without ``antialias``) computes them: each column is its resize of a unit vector."""
    columns = []
    for start in range(0, size_in, _MATRIX_CHUNK):
        count = min(_MATRIX_CHUNK, size_in - start)
        units = torch.zeros(count, 1, 1, size_in, device=device)  # along the width: torch resizes an (n, 1)
        units.view(count, size_in).diagonal(start).fill_(1.0)  # column otherwise (antialias); made on the device
        resized = F.interpolate(units, size=(1, size_out), mode="bilinear", align_corners=False, antialias=antialias)
        columns.append(resized[:, 0, 0, :])
    return torch.cat(columns).T.contiguous()


class BandResize:
    """Bilinear resizing (``align_corners=False``) of (..., h, w) maps to (H, W) a band of output rows at a time.

    Bilinear resizing is separable: a band's rows are ``rows[band] @ maps`` with the 1-D weights of
    :func:`interpolation_matrix` (over the few source rows they touch), then ``F.interpolate`` along the width
    alone. A band equals the rows of ``F.interpolate(maps, (H, W))`` up to float rounding, and the full-size maps
    never exist. Maps already at (H, W) are sliced as they are.

    Args:
        source: (h, w) of the maps.
        target: (H, W) to resize them to.
        device: Where the weights live (that of the maps).
    """

    def __init__(self, source: tuple[int, int], target: tuple[int, int], device: torch.device) -> None:
        self.source, self.target = tuple(source), tuple(target)
        self.rows = None
        if self.source != self.target:
            self.rows = interpolation_matrix(source[0], target[0], False, device)
            touched = (self.rows != 0).cpu()
            self.first = touched.int().argmax(dim=1).tolist()  # the first and last source row of each output row
            self.last = (source[0] - 1 - touched.flip(1).int().argmax(dim=1)).tolist()

    def band(self, maps: Tensor, start: int, stop: int) -> Tensor:
        """Rows ``start:stop`` of ``maps`` resized: (..., h, w) -> (..., stop - start, W)."""
        if self.rows is None:
            return maps[..., start:stop, :]
        if not maps.numel():  # no map at all (an image without a present class's CAM)
            return maps.new_zeros(*maps.shape[:-2], stop - start, self.target[1], dtype=torch.float32)
        low, high = min(self.first[start:stop]), max(self.last[start:stop]) + 1
        rows = self.rows[start:stop, low:high] @ maps[..., low:high, :].float()
        flat = rows.reshape(1, -1, *rows.shape[-2:])
        wide = F.interpolate(flat, size=(stop - start, self.target[1]), mode="bilinear", align_corners=False)
        return wide.reshape(*rows.shape[:-1], self.target[1])

    def full(self, maps: Tensor) -> Tensor:
        """``maps`` resized whole: (..., h, w) -> (..., H, W)."""
        return self.band(maps, 0, self.target[0])
