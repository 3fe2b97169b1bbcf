"""The permutohedral lattice (Adams, Baek & Davis 2010) in PyTorch: Gaussian filtering of values over feature space.

This is the lattice of Krähenbühl & Koltun's dense CRF as pydensecrf builds it (``permutohedral.cpp``), with its
constants and its order of operations, so that the same float32 features give the same lattice points and the same
barycentric weights:

- **elevation**: feature ``f`` (d values, already divided by the kernel's standard deviations) is scaled by
  ``sqrt(2/3) (d+1) / sqrt((i+1)(i+2))`` per coordinate and lifted onto the hyperplane ``sum = 0`` of
  ``R^(d+1)``;
- **enclosing simplex**: the nearest remainder-0 lattice point by rounding each coordinate divided by ``d+1`` (ties
  to even), the coordinates ranked, and the point brought back onto the plane;
- **barycentric weights** of the d+1 simplex vertices, the vertices' integer keys (d coordinates; the last is
  redundant) from the canonical simplex;
- **lattice points** are the distinct keys: each image of a batch has its own (the image index is one more key
  coordinate), found by sorting integer codes (``torch.unique``) instead of pydensecrf's hash table, so no two keys
  can collide;
- **filtering**: splat (each value spread to its d+1 vertices with its barycentric weights), blur along each of the
  d+1 lattice directions with the kernel ``[1/2, 1, 1/2]`` (a missing neighbour counts as 0), slice (gather back
  with the same weights), scaled by ``alpha = 1 / (1 + 2^-d)``.

Splat, blur and slice are sparse matrix products (CSR), built once per lattice, so a mean-field iteration is a few
sparse-dense products on whatever device the features are on, and the sums are deterministic.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

__all__ = ["Lattice", "build_lattice"]

_CODE_BITS = 62
"""Keys pack into one int64 code when their coordinate ranges need at most this many bits (else rows are sorted)."""


@dataclass
class Lattice:
    """A permutohedral lattice over N points (of one or many images), ready to filter (N, C) values.

    Attributes:
        splat: (M, N) CSR matrix: lattice point <- point, the barycentric weights.
        slice: (N, M) CSR matrix: point <- lattice point, the barycentric weights times ``alpha``.
        blur: d+1 (M, M) CSR matrices ``I + (P_-1 + P_+1) / 2``, one per lattice direction, applied in order.
        points: M, the number of lattice points.
    """

    splat: Tensor
    slice: Tensor
    blur: list[Tensor]
    points: int

    def filter(self, values: Tensor) -> Tensor:
        """(N, C) values of the lattice's dtype -> (N, C) Gaussian-filtered values (``Permutohedral::compute``)."""
        lattice_values = self.splat @ values
        for blur in self.blur:
            lattice_values = blur @ lattice_values
        return self.slice @ lattice_values


def build_lattice(
    features: Tensor,
    segments: Tensor | None = None,
    dtype: torch.dtype = torch.float32,
    reference_padding: bool = False,
) -> Lattice:
    """The lattice of ``features``, one separate lattice per segment (image) when ``segments`` is given.

    Args:
        features: (N, d) float32 positions in feature space, already divided by the standard deviations.
        segments: (N,) int64 image index of each point, or None for one image. Points of different segments never
            share a lattice point, so one call filters many images independently.
        dtype: Of the filter's weights, and so of the values it filters (the lattice itself is found in float32,
            as pydensecrf finds it).
        reference_padding: Add the lattice points that pydensecrf's SSE build adds: it places the points in groups
            of four, and pads the last group of an image whose N is not a multiple of 4 with points at feature 0.
            They splat nothing and are never sliced, but their simplex's vertices join the lattice and relay the
            blur between the real vertices around them (marginals move by up to 8e-3 on random colours).

    Returns:
        The :class:`Lattice`, on the device of ``features``.
    """
    if features.ndim != 2 or features.dtype != torch.float32:
        raise ValueError(f"features must be (N, d) float32, got {tuple(features.shape)} {features.dtype}")
    n, d = features.shape
    device = features.device
    if reference_padding:
        counts = torch.bincount(segments) if segments is not None else torch.tensor([n], device=device)
        padded = (counts % 4 != 0).nonzero()[:, 0]
        features = torch.cat([features, features.new_zeros(padded.numel(), d)])
        if segments is not None:
            segments = torch.cat([segments, padded])
    elevated = _elevate(features)
    rem0, rank = _enclosing_simplex(elevated)
    weights = _barycentric(elevated, rem0, rank)
    # keys[:, r, i] = rem0[i] + canonical[r][rank[i]], the canonical simplex's vertex r being
    # (r, ..., r, r - (d+1), ..., r - (d+1)) with d+1-r leading r's
    r = torch.arange(d + 1, device=device)
    keys = rem0[:, None, :d] + r[None, :, None] - (d + 1) * (rank[:, None, :d] > (d - r)[None, :, None]).long()
    keys = keys.reshape(-1, d)
    if segments is not None:
        keys = torch.cat([segments.to(device).long().repeat_interleave(d + 1)[:, None], keys], dim=1)
    order, vertex, neighbours, m = _index_keys(keys, d, offset=0 if segments is None else 1)
    # Lattice values carry one extra row 0 (pydensecrf's "-1 -> 0" shift): what a missing neighbour reads
    size = m + 1
    real = order < n * (d + 1)  # the padding points splat nothing
    splat = _csr(torch.bincount(vertex[real] + 1, minlength=size), order[real] // (d + 1),
                 weights.reshape(-1)[order[real]], (size, n), dtype)  # fmt: skip
    by_entry = torch.empty_like(vertex).scatter_(0, order, vertex + 1).view(-1, d + 1)[:n]
    weights = weights[:n]
    cols, sort = by_entry.sort(dim=1)  # CSR columns ascend within a row
    alpha = np.float32(1.0 / (1.0 + 2.0 ** (-d)))
    slice_ = _csr(torch.full((n,), d + 1, device=device), cols.reshape(-1),
                  weights.view(n, d + 1).gather(1, sort).reshape(-1) * float(alpha), (n, size), dtype)  # fmt: skip
    blur = []
    own = torch.arange(1, size, device=device)
    for n1, n2 in neighbours:
        cols, sort = torch.stack([own, n1, n2], dim=1).sort(dim=1)
        values = torch.tensor([1.0, 0.5, 0.5], device=device).expand(m, 3).gather(1, sort)
        there = cols > 0  # a missing neighbour (0) adds nothing: leave it out
        counts = torch.cat([torch.zeros(1, dtype=torch.long, device=device), there.sum(dim=1)])
        blur.append(_csr(counts, cols[there], values[there], (size, size), dtype))
    return Lattice(splat=splat, slice=slice_, blur=blur, points=m)


def _elevate(features: Tensor) -> Tensor:
    """(N, d) -> (N, d+1) coordinates on the plane sum = 0, in float32 as pydensecrf computes them."""
    n, d = features.shape
    inv_std_dev = np.float32(math.sqrt(2.0 / 3.0) * (d + 1))
    elevated = features.new_empty(n, d + 1)
    sm = features.new_zeros(n)
    for j in range(d, 0, -1):
        scale = float(np.float32(1.0 / math.sqrt((j + 1) * j) * float(inv_std_dev)))
        cf = features[:, j - 1] * scale
        elevated[:, j] = sm - cf * float(j)
        sm = sm + cf
    elevated[:, 0] = sm
    return elevated


def _enclosing_simplex(elevated: Tensor) -> tuple[Tensor, Tensor]:
    """The remainder-0 point ``rem0`` (N, d+1) int64 and the rank (N, d+1) int64 of each coordinate's remainder."""
    d = elevated.shape[1] - 1
    down = float(np.float32(1.0) / np.float32(d + 1))
    v = torch.round(elevated * down)  # ties to even, as the SSE conversion in the reference
    rem0 = v * float(d + 1)
    total = v.sum(dim=1, keepdim=True)  # integers: exact in any order
    diff = elevated - rem0
    before = diff[:, :, None] < diff[:, None, :]  # (N, i, j): coordinate i's remainder below j's
    upper = torch.ones(d + 1, d + 1, dtype=torch.bool, device=elevated.device).triu(1)
    rank = (before & upper).sum(dim=2) + (~before & upper).sum(dim=1)  # a tie ranks the later coordinate higher
    rank = rank + total.long()
    wrap = (rank < 0).long() - (rank > d).long()
    rank = rank + (d + 1) * wrap
    rem0 = rem0.long() + (d + 1) * wrap
    return rem0, rank


def _barycentric(elevated: Tensor, rem0: Tensor, rank: Tensor) -> Tensor:
    """(N, d+1) float32 weights of the simplex vertices 0..d (each row sums to 1)."""
    d = elevated.shape[1] - 1
    down = float(np.float32(1.0) / np.float32(d + 1))
    v = (elevated - rem0.float()) * down
    by_slot = torch.zeros_like(v).scatter_(1, d - rank, v)  # by_slot[:, p] = v of the coordinate ranked d - p
    weights = torch.empty_like(v)
    weights[:, 1:] = by_slot[:, 1:] - by_slot[:, :-1]  # slot p gets +v of rank d-p and -v of rank d-p+1
    weights[:, 0] = by_slot[:, 0] + (1.0 - by_slot[:, d])  # slot d+1 (-v of rank 0) wraps around into slot 0
    return weights


def _index_keys(keys: Tensor, d: int, offset: int) -> tuple[Tensor, Tensor, list[tuple[Tensor, Tensor]], int]:
    """Sort the (L, k) key rows into lattice points.

    Returns ``order`` (L,), the rows in ascending key order (stable); ``vertex`` (L,), the lattice point (0..M-1)
    of each row in that order; for each direction j the indices + 1 of every lattice point's two neighbours (0
    where absent); and M. Key columns from ``offset`` on are lattice coordinates; earlier ones (the image index)
    stay fixed in the blur.
    """
    steps = []  # (2 * (d+1), k): the shift to each neighbour, n1 then n2 per direction
    for j in range(d + 1):
        n1 = torch.full((keys.shape[1],), -1, dtype=torch.long)
        n1[:offset] = 0
        if j < d:
            n1[offset + j] = d
        steps += [n1, -n1]
    steps = torch.stack(steps).to(keys.device)
    low = keys.min(dim=0).values - d
    span = keys.max(dim=0).values + d - low + 1
    if sum(int(s).bit_length() for s in span.tolist()) <= _CODE_BITS:
        stride = torch.ones_like(span)
        stride[:-1] = torch.flip(torch.cumprod(torch.flip(span[1:], [0]), 0), [0])
        codes, order = torch.sort(((keys - low) * stride).sum(dim=1), stable=True)
        first = torch.ones_like(codes, dtype=torch.bool)
        first[1:] = codes[1:] != codes[:-1]
        vertex = torch.cumsum(first, 0) - 1
        unique = codes[first]
        m = unique.numel()
        shifted = unique[None, :] + (steps * stride).sum(dim=1)[:, None]  # (2(d+1), M)
        found = torch.searchsorted(unique, shifted).clamp_(max=m - 1)
        index = torch.where(unique[found] == shifted, found + 1, 0)
    else:  # too wide for one int64: sort the key rows themselves
        unique, inverse = torch.unique(keys, dim=0, return_inverse=True)
        vertex, order = torch.sort(inverse, stable=True)
        m = unique.shape[0]
        shifted = (unique[None] + steps[:, None, :]).reshape(-1, keys.shape[1])
        both, which = torch.unique(torch.cat([unique, shifted]), dim=0, return_inverse=True)
        table = torch.zeros(both.shape[0], dtype=torch.long, device=keys.device)
        table[which[:m]] = torch.arange(1, m + 1, device=keys.device)
        index = table[which[m:]].reshape(2 * (d + 1), m)
    return order, vertex, [(index[2 * j], index[2 * j + 1]) for j in range(d + 1)], m


def _csr(counts: Tensor, cols: Tensor, values: Tensor, size: tuple[int, int], dtype: torch.dtype) -> Tensor:
    """A CSR matrix from the number of entries of each row and the entries' columns and values, row by row."""
    crow = torch.zeros(counts.numel() + 1, dtype=torch.long, device=cols.device)
    torch.cumsum(counts, 0, out=crow[1:])
    with warnings.catch_warnings():  # "Sparse CSR tensor support is in beta state"
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(crow, cols, values.to(dtype), size, check_invariants=False)
