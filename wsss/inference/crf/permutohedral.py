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
  coordinate), found exactly (no two keys can collide) through a table over every cell of the keys' ranges where it
  is small (pixel positions), else by sorting integer codes, instead of pydensecrf's hash table; they are numbered
  in the order that hash table inserts them (the first pixel reaching each), which keeps the products local;
- **filtering**: splat (each value spread to its d+1 vertices with its barycentric weights), blur along each of the
  d+1 lattice directions with the kernel ``[1/2, 1, 1/2]`` (a missing neighbour counts as 0), slice (gather back
  with the same weights), scaled by ``alpha = 1 / (1 + 2^-d)``.

Splat, blur and slice are sparse matrix products (CSR), built once per lattice, so a mean-field iteration is a few
sparse-dense products on whatever device the features are on, and the sums are deterministic.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import Tensor

__all__ = ["Lattice", "build_lattice"]

_CODE_BITS = 62
"""Keys pack into one int64 code when their coordinate ranges span fewer than 2 ** this many cells (else rows are
sorted)."""
_NATIVE_PRODUCT_COLUMNS = 48
"""Filtering at least this many values per point (classes), the CPU multiplies through torch's own sparse kernel:
measured per image on one thread against MKL's, in one process (bench/bench_crf.py's photographs): 81 classes 5.98 s
against 7.55, 21 classes 0.92 against 0.81."""
_DENSE_CELLS_PER_ENTRY = 4
"""Keys are numbered through a table over every cell of their ranges when it has at most this many cells per entry
(a 2-d lattice of pixel positions: about 3; colour keys have far more): a scatter and gathers instead of a sort and
a binary search. The table holds one int64 per cell."""


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

    def filter(self, values: Tensor, add_to: Tensor | None = None) -> Tensor:
        """(N, C) values of the lattice's dtype -> (N, C) Gaussian-filtered values (``Permutohedral::compute``),
        added in place to ``add_to`` (N, C) when given (one pass over the output fewer)."""
        lattice_values = _product(self.splat, values)
        for blur in self.blur:
            lattice_values = _product(blur, lattice_values)
        return self.slice @ lattice_values if add_to is None else add_to.addmm_(self.slice, lattice_values)

    def scaled(self, outer: Tensor, inner: Tensor) -> Lattice:
        """The lattice whose :meth:`filter` gives ``outer * filter(inner * values)`` for (N, 1) ``outer`` and
        ``inner``: the per-point factors folded into the slice's and the splat's weights (a kernel's normalisation
        and weight cost no pass over the values)."""
        return replace(self, splat=_scale(self.splat, inner[:, 0], rows=False), slice=_scale(self.slice, outer[:, 0]))


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
    vertex, neighbours, m = _index_vertices(rem0, rank, segments)
    # Lattice values carry one extra row 0 (pydensecrf's "-1 -> 0" shift): what a missing neighbour reads
    size = m + 1
    vertex = vertex[: n * (d + 1)]  # the padding points' entries follow: they splat nothing
    order = torch.sort(vertex.int() if vertex.numel() < 2**31 else vertex, stable=True).indices  # by point, in order
    splat = _csr(torch.bincount(vertex + 1, minlength=size), order // (d + 1), weights.reshape(-1)[order],
                 (size, n), dtype)  # fmt: skip
    by_entry = (vertex + 1).view(n, d + 1)
    weights = weights[:n]
    cols, sort = by_entry.sort(dim=1)  # CSR columns ascend within a row
    alpha = np.float32(1.0 / (1.0 + 2.0 ** (-d)))
    slice_ = _csr(torch.full((n,), d + 1, device=device), cols.reshape(-1),
                  weights.view(n, d + 1).gather(1, sort).reshape(-1) * float(alpha), (n, size), dtype)  # fmt: skip
    blur = []
    own = torch.arange(1, size, device=device)
    counts = torch.full((size,), 3, device=device)
    counts[0] = 0  # row 0 stays 0
    for n1, n2 in neighbours:
        # the row's three columns in ascending order (a missing neighbour, 0, reads row 0: it adds 0 exactly)
        low, high = torch.minimum(n1, n2), torch.maximum(n1, n2)
        first, last = torch.minimum(own, low), torch.maximum(own, high)
        cols = torch.stack([first, own + low + high - first - last, last], dim=1)
        values = torch.where(cols == own[:, None], 1.0, 0.5)
        blur.append(_csr(counts, cols.reshape(-1), values.reshape(-1), (size, size), dtype))
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
    # a coordinate's rank counts the later coordinates whose remainder is above its own and the earlier ones at or
    # above it (a tie ranks the later coordinate higher), one column j at a time: no (N, d+1, d+1) comparison
    rank = torch.zeros_like(diff, dtype=torch.uint8)
    for j in range(d + 1):
        column = diff[:, j : j + 1]
        rank[:, :j] += column > diff[:, :j]
        rank[:, j + 1 :] += column >= diff[:, j + 1 :]
    rank = rank.long() + total.long()
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


def _index_vertices(
    rem0: Tensor, rank: Tensor, segments: Tensor | None
) -> tuple[Tensor, list[tuple[Tensor, Tensor]], int]:
    """Number the simplex vertices of every point: the lattice points.

    The vertex r of point i has the key ``rem0[i, :d] + r - (d+1) [rank[i, :d] > d - r]`` (the canonical simplex's
    vertex r is (r, ..., r, r - (d+1), ..., r - (d+1)) with d+1-r leading r's, in the order of the ranks), the
    image index (``segments``) before it. Lattice points are numbered in the order pydensecrf's hash table inserts
    them: by the first entry (point, vertex) that reaches them, so points near in the image are near in memory: the
    Gaussian kernel's splat and slice products ran 2.4x and 3.8x faster on the CPU than in key order (500 x 375).

    Returns ``vertex`` (L,) with L = N (d+1): the lattice point (0..M-1) of each entry, point-major; for each
    direction j the indices + 1 of every lattice point's two neighbours (0 where absent); and M.
    """
    n, d = rem0.shape[0], rem0.shape[1] - 1
    device = rem0.device
    entries = torch.arange(n * (d + 1), device=device)
    low, spans = _code_box(rem0)
    images = int(segments.max()) + 1 if segments is not None else 1
    cells = math.prod(spans) * images
    if cells >= 2**_CODE_BITS:  # too wide for one int64 code: sort the key rows themselves
        return _index_rows(_keys(rem0, rank, segments), d, offset=0 if segments is None else 1)
    strides = [math.prod(spans[i + 1 :]) for i in range(d)]
    stride = torch.tensor(strides, device=device)
    base = ((rem0[:, :d] - low) * stride).sum(dim=1)
    if segments is not None:
        base += segments.to(device).long() * math.prod(spans)
    # code(i, r) = base(i) + r sum(stride) - (d+1) T(i, d+1-r), T(i, k) the strides of the columns ranked >= k
    by_rank = torch.zeros(n, d + 2, dtype=torch.long, device=device).scatter_(1, rank[:, :d], stride.expand(n, d))
    above = by_rank.flip(1).cumsum_(1)[:, : d + 1]  # above[:, r] = T(i, d+1-r) (rank d+1 holds nothing)
    r = torch.arange(d + 1, device=device)
    codes = above.mul_(-(d + 1)).add_(base[:, None]).add_(r * sum(strides)).reshape(-1)
    steps = []  # the code shift to each neighbour, n1 then n2 per direction: every column -1, column j +d
    for j in range(d + 1):
        step = -sum(strides) + ((d + 1) * strides[j] if j < d else 0)
        steps += [step, -step]
    steps = torch.tensor(steps, device=device)
    if cells <= _DENSE_CELLS_PER_ENTRY * entries.numel():  # a table over every cell, no sort, no search
        first = torch.full((cells,), entries.numel(), device=device).scatter_reduce_(0, codes, entries, "amin")
        points = (first < entries.numel()).nonzero()[:, 0]
        points = points[torch.argsort(first[points])]  # insertion order
        m = points.numel()
        table = first.zero_()
        table[points] = torch.arange(1, m + 1, device=device)
        vertex = table[codes] - 1
        index = table[points[None, :] + steps[:, None]]  # (2(d+1), M); margins keep every shift in the table
    else:
        sorted_codes, order = torch.sort(codes, stable=True)
        first = torch.ones_like(sorted_codes, dtype=torch.bool)
        first[1:] = sorted_codes[1:] != sorted_codes[:-1]
        unique = sorted_codes[first]
        m = unique.numel()
        by_code = torch.empty_like(entries).scatter_(0, order, torch.cumsum(first, 0) - 1)  # key-order number
        renumber = _insertion_order(order[first])  # the first entry of each key is its first in the stable sort
        vertex = renumber[by_code]
        shifted = unique[torch.argsort(renumber)][None, :] + steps[:, None]
        found = torch.searchsorted(unique, shifted).clamp_(max=m - 1)
        index = torch.where(unique[found] == shifted, renumber[found] + 1, 0)
    return vertex, [(index[2 * j], index[2 * j + 1]) for j in range(d + 1)], m


def _code_box(rem0: Tensor) -> tuple[Tensor, list[int]]:
    """The lowest value (d,) and the number of values of each key column over every vertex and its neighbours: a
    vertex column is rem0 - d .. rem0 + d (r - (d+1) >= -d for r >= 1), a neighbour's one further d either way."""
    d = rem0.shape[1] - 1
    low = rem0[:, :d].min(dim=0).values - 2 * d
    return low, (rem0[:, :d].max(dim=0).values + 2 * d - low + 1).tolist()


def _insertion_order(first_entry: Tensor) -> Tensor:
    """(M,) new number of each lattice point given the first entry that reaches it: the rank of that entry."""
    renumber = torch.empty_like(first_entry)
    renumber[torch.argsort(first_entry)] = torch.arange(first_entry.numel(), device=first_entry.device)
    return renumber


def _keys(rem0: Tensor, rank: Tensor, segments: Tensor | None) -> Tensor:
    """(L, k) integer keys of every entry (:func:`_index_vertices`), the image index first when ``segments``."""
    d = rem0.shape[1] - 1
    r = torch.arange(d + 1, device=rem0.device)
    keys = rem0[:, None, :d] + r[None, :, None] - (d + 1) * (rank[:, None, :d] > (d - r)[None, :, None]).long()
    keys = keys.reshape(-1, d)
    if segments is not None:
        keys = torch.cat([segments.to(rem0.device).long().repeat_interleave(d + 1)[:, None], keys], dim=1)
    return keys


def _index_rows(keys: Tensor, d: int, offset: int) -> tuple[Tensor, list[tuple[Tensor, Tensor]], int]:
    """:func:`_index_vertices` by sorting the (L, k) key rows (keys too wide for one int64 code). Key columns from
    ``offset`` on are lattice coordinates; earlier ones (the image index) stay fixed in the blur."""
    steps = []  # (2 * (d+1), k): the shift to each neighbour, n1 then n2 per direction
    for j in range(d + 1):
        n1 = torch.full((keys.shape[1],), -1, dtype=torch.long)
        n1[:offset] = 0
        if j < d:
            n1[offset + j] = d
        steps += [n1, -n1]
    steps = torch.stack(steps).to(keys.device)
    unique, inverse = torch.unique(keys, dim=0, return_inverse=True)
    m = unique.shape[0]
    entries = torch.arange(keys.shape[0], device=keys.device)
    first = torch.full((m,), keys.shape[0], device=keys.device).scatter_reduce_(0, inverse, entries, "amin")
    renumber = _insertion_order(first)
    shifted = (unique[None] + steps[:, None, :]).reshape(-1, keys.shape[1])
    both, which = torch.unique(torch.cat([unique, shifted]), dim=0, return_inverse=True)
    table = torch.zeros(both.shape[0], dtype=torch.long, device=keys.device)
    table[which[:m]] = renumber + 1
    index = table[which[m:]].reshape(2 * (d + 1), m)[:, torch.argsort(renumber)]
    return renumber[inverse], [(index[2 * j], index[2 * j + 1]) for j in range(d + 1)], m


def _product(matrix: Tensor, dense: Tensor) -> Tensor:
    """``matrix @ dense``; on the CPU with many columns through torch's own kernel (``reduce="sum"``), which is
    faster there than MKL's (:data:`_NATIVE_PRODUCT_COLUMNS`)."""
    if dense.device.type == "cpu" and dense.shape[1] >= _NATIVE_PRODUCT_COLUMNS:
        return torch.sparse.mm(matrix, dense, "sum")
    return matrix @ dense


def _scale(matrix: Tensor, factors: Tensor, rows: bool = True) -> Tensor:
    """The CSR ``matrix`` with each row (else each column) multiplied by its entry of ``factors``."""
    crow, col = matrix.crow_indices(), matrix.col_indices()
    if rows:
        factors = factors.repeat_interleave(crow[1:] - crow[:-1], output_size=col.numel())
    else:
        factors = factors[col]
    return torch.sparse_csr_tensor(crow, col, matrix.values() * factors, matrix.shape, check_invariants=False)


def _csr(counts: Tensor, cols: Tensor, values: Tensor, size: tuple[int, int], dtype: torch.dtype) -> Tensor:
    """A CSR matrix from the number of entries of each row and the entries' columns and values, row by row; int32
    indices where they fit (MKL takes no others: int64 ones are converted at every product)."""
    crow = torch.zeros(counts.numel() + 1, dtype=torch.long, device=cols.device)
    torch.cumsum(counts, 0, out=crow[1:])
    if cols.numel() < 2**31 and max(size) < 2**31:
        crow, cols = crow.int(), cols.int()
    with warnings.catch_warnings():  # "Sparse CSR tensor support is in beta state"
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(crow, cols, values.to(dtype), size, check_invariants=False)
