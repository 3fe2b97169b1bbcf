"""The dense CRF's sparse products and its lattice's simplices (:mod:`wsss.inference.crf.permutohedral`) as Triton
kernels.

A mean-field iteration filters the marginals through each lattice: a splat (lattice points <- pixels, CSR rows of any
length), one blur per lattice direction (three entries per row) and a slice (pixels <- their d+1 vertices), each a
product of a CSR matrix with a dense (rows, C) block. On a GPU PyTorch runs each through cuSPARSE, which queries and
allocates its buffer at every call, and the mean-field adds a copy of the prior before the slices and a softmax after
them. :func:`product` is the splat and the slice in one kernel: a program holds a tile of ``BLOCK_ROWS`` rows and
``BLOCK_CHANNELS`` channels, walks each row's entries in their stored order (from 0, as a CSR product sums), adds
``base`` and a second matrix's product when asked (the mean-field's two slices in one pass) and takes the softmax of
each row when asked. :func:`blur` is one direction's blur read from the lattice points' two neighbours themselves
(the lattice keeps them instead of a matrix per direction: 8 bytes per point instead of 28, and no matrix to build),
summed as the matrix's product sums; or two or three directions' blurs one after the other in one launch, each earlier
direction's rows computed where the next one reads them (``infer.crf.blur_directions``: the same sums, the values in
between never stored, but 9 or 27 rows gathered per point instead of 3 per direction). One iteration of the paper's
CRF is 12 launches (a splat and 3 + 6 blurs per lattice, then both slices in one launch that adds the prior and takes
the softmax: of each stack on its own for the pseudo-label export's stacks; 8 with 2 directions per blur launch, 6
with 3), each reading each value once.

:func:`simplices` elevates the features and finds each point's enclosing simplex and barycentric weights, the
construction's first steps, in one launch where PyTorch dispatches about 80 operations per lattice; it computes them
exactly as the PyTorch functions do (the same float32 operations in the same order, no fused multiply-adds).

Float32 throughout, as the PyTorch path; what differs in the products is rounding (a fused multiply-add where a
sparse library may round the product first, and a library's own order of a row's entries):
``tests/inference/test_crf_kernels.py`` holds the products within float32 tolerance of the PyTorch path, the simplices
equal to it and the whole CRF's labels equal to it.

Whether Triton compiles or interprets is decided when this module is first imported (``TRITON_INTERPRET=1`` before
that runs the kernels on CPU tensors), as for :mod:`wsss.energy_kernel`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from wsss.config import CRF_BLUR_DIRECTIONS

# Blocks from the compiled register use (bench/kernel_registers.py: compiled for sm_90a without a GPU).
TILE = 1024
"""Values per program: ``BLOCK_ROWS`` = this / ``BLOCK_CHANNELS``, within ``ROWS_RANGE``."""
NESTED_TILE = 512
"""Values per program of a blur of 2 or 3 directions in one launch: at 21 classes and 8 warps, 16 x 32 takes 52 and 71
registers (32 and 24 warps per SM) where 32 x 32 took 106 and 122 (16)."""
ROWS_RANGE = (8, 256)
CHANNELS = 32
"""Channels per program at most, unless the program takes the rows' softmax (then all of a row's channels)."""
SOFTMAX_CHANNELS = 128
"""The most channels whose softmax the product takes in its own program; wider rows take it apart."""
NUM_WARPS = 8
LAUNCHED = ("_product_kernel", "_blur_kernel", "_simplex_kernel")
"""This module's kernels, by name: where a count of the launches replaces them (``bench/bench_crf.py --launches``)."""
SIMPLEX_TILE = 2048
"""Points x (d+1)^2 (padded to powers of two) per program of :func:`simplices`: its rank and slot comparisons. 128
points for the Gaussian kernel's 2-d features take 52 registers, 32 for the bilateral's 5-d 103, no spills (64 of
them: 157; 128: spills)."""


@triton.jit
def _live_rows(rows, live_ptr, HAS_LIVE: tl.constexpr):
    """The rows a program may touch: all ``rows``, or with ``HAS_LIVE`` row 0 and the lattice's real points (the
    count at ``live_ptr``), which come first."""
    if HAS_LIVE:
        rows = tl.minimum(rows, tl.load(live_ptr) + 1)
    return rows


@triton.jit
def _row_sums(crow_ptr, col_ptr, val_ptr, x_ptr, r, r_ok, c, c_ok, channels,
              BLOCK_ROWS: tl.constexpr, BLOCK_CHANNELS: tl.constexpr):  # fmt: skip
    """``sum_e val[e] x[col[e]]`` over the entries ``e`` of each CSR row ``r``, in their stored order from 0."""
    start = tl.load(crow_ptr + r, mask=r_ok, other=0)
    count = tl.load(crow_ptr + r + 1, mask=r_ok, other=0) - start
    acc = tl.zeros((BLOCK_ROWS, BLOCK_CHANNELS), dtype=tl.float32)
    for k in range(tl.max(count, axis=0)):  # the block's longest row; shorter rows are masked
        entry_ok = k < count
        col = tl.load(col_ptr + start + k, mask=entry_ok, other=0).to(tl.int64)
        val = tl.load(val_ptr + start + k, mask=entry_ok, other=0.0)
        x = tl.load(x_ptr + col[:, None] * channels + c[None, :], mask=entry_ok[:, None] & c_ok[None, :], other=0.0)
        acc += val[:, None] * x
    return acc


@triton.jit
def _product_kernel(
    crow_ptr, col_ptr, val_ptr, x_ptr, crow2_ptr, col2_ptr, val2_ptr, x2_ptr, base_ptr, out_ptr, live_ptr, rows,
    channels, HAS_BASE: tl.constexpr, HAS_SECOND: tl.constexpr, HAS_LIVE: tl.constexpr, SOFTMAX: tl.constexpr,
    GROUPS: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_CHANNELS: tl.constexpr,
):  # fmt: skip
    """``out[r] = softmax?((base[r] + sum_e val[e] x[col[e]]) + sum_e val2[e] x2[col2[e]])`` over the entries ``e``
    of CSR row ``r`` of each matrix in order, each sum from 0 (the second with ``HAS_SECOND``: two products in one
    pass, rounded as the two products one after the other); the softmax of each of ``GROUPS`` equal groups of a
    row's channels on its own.

    ``crow_ptr``: ``(rows + 1,)`` row offsets; ``col_ptr``, ``val_ptr``: the entries' columns and float32 values;
    ``x_ptr``: ``(*, channels)`` float32; the same for the second matrix; ``base_ptr``, ``out_ptr``: ``(rows,
    channels)`` float32 (``base_ptr`` may be ``out_ptr``: each value is read before the program writes it);
    ``live_ptr``: with ``HAS_LIVE``, the rows past ``1 + *live_ptr`` are left as they are (:func:`_live_rows`).
    Grid: (row blocks, channel blocks).
    """
    rows = _live_rows(rows, live_ptr, HAS_LIVE)
    r = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    r_ok = r < rows
    c = tl.program_id(1) * BLOCK_CHANNELS + tl.arange(0, BLOCK_CHANNELS)
    c_ok = c < channels
    acc = _row_sums(crow_ptr, col_ptr, val_ptr, x_ptr, r, r_ok, c, c_ok, channels, BLOCK_ROWS, BLOCK_CHANNELS)
    tile = r.to(tl.int64)[:, None] * channels + c[None, :]
    tile_ok = r_ok[:, None] & c_ok[None, :]
    if HAS_BASE:
        acc = tl.load(base_ptr + tile, mask=tile_ok, other=0.0) + acc
    if HAS_SECOND:
        acc = acc + _row_sums(crow2_ptr, col2_ptr, val2_ptr, x2_ptr, r, r_ok, c, c_ok, channels, BLOCK_ROWS,
                              BLOCK_CHANNELS)  # fmt: skip
    if SOFTMAX:  # the program holds every channel of its rows
        acc = tl.where(c_ok[None, :], acc, float("-inf"))
        if GROUPS == 1:
            e = tl.exp(acc - tl.max(acc, axis=1)[:, None])
            acc = e / tl.sum(e, axis=1)[:, None]
        else:  # each group's exponentials are 0 outside it
            size = channels // GROUPS
            grouped = tl.zeros((BLOCK_ROWS, BLOCK_CHANNELS), dtype=tl.float32)
            for g in tl.static_range(GROUPS):
                part = tl.where(((c >= g * size) & (c < g * size + size))[None, :], acc, float("-inf"))
                e = tl.exp(part - tl.max(part, axis=1)[:, None])
                grouped += e / tl.sum(e, axis=1)[:, None]
            acc = grouped
    tl.store(out_ptr + tile, acc, mask=tile_ok)


@triton.jit
def _blur_columns(neighbour_ptr, second, q, ok):
    """Rows ``q`` (where ``ok``) of one direction's blur matrix: the point's own row and its columns in ascending
    order (the two neighbours' rows + 1 at ``neighbour_ptr`` and ``second`` entries after it; 0: absent)."""
    n1 = tl.load(neighbour_ptr + q - 1, mask=ok, other=0).to(tl.int64)
    n2 = tl.load(neighbour_ptr + second + q - 1, mask=ok, other=0).to(tl.int64)
    own = tl.where(ok, q, 0).to(tl.int64)
    low, high = tl.minimum(n1, n2), tl.maximum(n1, n2)
    first, last = tl.minimum(own, low), tl.maximum(own, high)
    return own, first, own + low + high - first - last, last


@triton.jit
def _blur_weight(col, own, ok):
    """The blur weight of column ``col`` of row ``own``: 1 for the point's own row, else 1/2 (0 where not ``ok``)."""
    return tl.where(ok, tl.where(col == own, 1.0, 0.5), 0.0)


@triton.jit
def _blur_entry(acc, x_ptr, col, own, ok, c, c_ok, channels):
    """``acc`` plus row ``col`` of the values times its blur weight."""
    x = tl.load(x_ptr + col[:, None] * channels + c[None, :], mask=ok[:, None] & c_ok[None, :], other=0.0)
    return acc + _blur_weight(col, own, ok)[:, None] * x


@triton.jit
def _blurred(x_ptr, neighbour_ptr, second, q, ok, c, c_ok, channels,
             BLOCK_ROWS: tl.constexpr, BLOCK_CHANNELS: tl.constexpr):  # fmt: skip
    """Rows ``q`` of one direction's blur of the values at ``x_ptr``, zeros where not ``ok`` (as row 0)."""
    own, first, mid, last = _blur_columns(neighbour_ptr, second, q, ok)
    acc = tl.zeros((BLOCK_ROWS, BLOCK_CHANNELS), dtype=tl.float32)
    acc = _blur_entry(acc, x_ptr, first, own, ok, c, c_ok, channels)
    acc = _blur_entry(acc, x_ptr, mid, own, ok, c, c_ok, channels)
    return _blur_entry(acc, x_ptr, last, own, ok, c, c_ok, channels)


@triton.jit
def _blurred_twice(x_ptr, neighbour_ptr, second, step, q, ok, c, c_ok, channels,
                   BLOCK_ROWS: tl.constexpr, BLOCK_CHANNELS: tl.constexpr):  # fmt: skip
    """Rows ``q`` of the blur along the direction ``step`` entries after ``neighbour_ptr``'s of the blur along that
    one, each row of the first blur computed where the second reads it (not stored): :func:`_blurred`'s sums with
    the first blur's rows in place of the loads."""
    own, first, mid, last = _blur_columns(neighbour_ptr + step, second, q, ok)
    acc = tl.zeros((BLOCK_ROWS, BLOCK_CHANNELS), dtype=tl.float32)
    acc += _blur_weight(first, own, ok)[:, None] * _blurred(x_ptr, neighbour_ptr, second, first, ok & (first > 0), c,
                                                            c_ok, channels, BLOCK_ROWS, BLOCK_CHANNELS)  # fmt: skip
    acc += _blur_weight(mid, own, ok)[:, None] * _blurred(x_ptr, neighbour_ptr, second, mid, ok & (mid > 0), c, c_ok,
                                                          channels, BLOCK_ROWS, BLOCK_CHANNELS)  # fmt: skip
    acc += _blur_weight(last, own, ok)[:, None] * _blurred(x_ptr, neighbour_ptr, second, last, ok & (last > 0), c,
                                                           c_ok, channels, BLOCK_ROWS, BLOCK_CHANNELS)  # fmt: skip
    return acc


@triton.jit
def _blurred_thrice(x_ptr, neighbour_ptr, second, step, q, ok, c, c_ok, channels,
                    BLOCK_ROWS: tl.constexpr, BLOCK_CHANNELS: tl.constexpr):  # fmt: skip
    """:func:`_blurred_twice` with a third direction (``2 step`` entries after ``neighbour_ptr``'s) outside."""
    own, first, mid, last = _blur_columns(neighbour_ptr + 2 * step, second, q, ok)
    acc = tl.zeros((BLOCK_ROWS, BLOCK_CHANNELS), dtype=tl.float32)
    acc += _blur_weight(first, own, ok)[:, None] * _blurred_twice(
        x_ptr, neighbour_ptr, second, step, first, ok & (first > 0), c, c_ok, channels, BLOCK_ROWS, BLOCK_CHANNELS)
    acc += _blur_weight(mid, own, ok)[:, None] * _blurred_twice(
        x_ptr, neighbour_ptr, second, step, mid, ok & (mid > 0), c, c_ok, channels, BLOCK_ROWS, BLOCK_CHANNELS)
    acc += _blur_weight(last, own, ok)[:, None] * _blurred_twice(
        x_ptr, neighbour_ptr, second, step, last, ok & (last > 0), c, c_ok, channels, BLOCK_ROWS, BLOCK_CHANNELS)
    return acc


@triton.jit
def _blur_kernel(
    neighbour_ptr, second, step, x_ptr, out_ptr, live_ptr, rows, channels, DIRECTIONS: tl.constexpr,
    HAS_LIVE: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_CHANNELS: tl.constexpr,
):  # fmt: skip
    """``out[r] = x[r] + (x[n1] + x[n2]) / 2`` for the lattice values' rows ``r >= 1``, ``n1``, ``n2`` the two
    neighbours of point ``r - 1`` along one direction (0: absent, row 0 holds zeros); row 0 stays 0. Summed as the
    CSR blur matrix's product sums (the columns ascending, the own weight 1 and the neighbours' 1/2). With
    ``DIRECTIONS`` 2 or 3, that many directions' blurs one after the other, each earlier blur's rows computed where
    the next one reads them: the float32 sums of as many launches, without their values stored in between.

    ``neighbour_ptr``: ``(DIRECTIONS, 2, rows - 1)`` integers, each direction ``step`` entries after the one before,
    its second row ``second`` entries after its first; ``x_ptr``, ``out_ptr``: ``(rows, channels)`` float32;
    ``live_ptr``: as :func:`_product_kernel`'s. Grid: (row blocks, channel blocks).
    """
    rows = _live_rows(rows, live_ptr, HAS_LIVE)
    r = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    r_ok = r < rows
    point_ok = r_ok & (r > 0)
    c = tl.program_id(1) * BLOCK_CHANNELS + tl.arange(0, BLOCK_CHANNELS)
    c_ok = c < channels
    q = r.to(tl.int64)
    if DIRECTIONS == 1:
        acc = _blurred(x_ptr, neighbour_ptr, second, q, point_ok, c, c_ok, channels, BLOCK_ROWS, BLOCK_CHANNELS)
    elif DIRECTIONS == 2:
        acc = _blurred_twice(x_ptr, neighbour_ptr, second, step, q, point_ok, c, c_ok, channels, BLOCK_ROWS,
                             BLOCK_CHANNELS)  # fmt: skip
    else:
        acc = _blurred_thrice(x_ptr, neighbour_ptr, second, step, q, point_ok, c, c_ok, channels, BLOCK_ROWS,
                              BLOCK_CHANNELS)  # fmt: skip
    tile = q[:, None] * channels + c[None, :]
    tl.store(out_ptr + tile, acc, mask=r_ok[:, None] & c_ok[None, :])


@triton.jit
def _simplex_kernel(
    features_ptr, scale_ptr, rem0_ptr, rank_ptr, weight_ptr, n, down,
    D: tl.constexpr, DP: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """Per point: its elevated coordinates, enclosing simplex and barycentric weights, as
    :mod:`~wsss.inference.crf.permutohedral`'s ``_elevate``, ``_enclosing_simplex`` and ``_barycentric`` compute them
    in float32 (launched without fused multiply-adds: the same roundings).

    ``features_ptr``: ``(n, D)`` float32; ``scale_ptr``: ``(D,)`` float32, column ``j - 1``'s elevation factor;
    ``rem0_ptr``, ``rank_ptr``: ``(n, D + 1)`` int64; ``weight_ptr``: ``(n, D + 1)`` float32. ``DP``: D + 1 rounded up
    to a power of two.
    """
    p = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    p_ok = p < n
    p = p.to(tl.int64)
    cols = tl.arange(0, DP)
    col_ok = cols < D + 1
    elevated = tl.zeros((BLOCK, DP), dtype=tl.float32)
    sm = tl.zeros((BLOCK,), dtype=tl.float32)
    for step in tl.static_range(D):  # j = D .. 1, as pydensecrf sums
        cf = tl.load(features_ptr + p * D + (D - 1 - step), mask=p_ok, other=0.0) * tl.load(scale_ptr + D - 1 - step)
        elevated = tl.where(cols[None, :] == D - step, (sm - cf * (D - step))[:, None], elevated)
        sm = sm + cf
    elevated = tl.where(cols[None, :] == 0, sm[:, None], elevated)
    # the nearest remainder-0 point: each coordinate / (D + 1) rounded half to even (floor and the exact fraction)
    x = elevated * down
    floor = tl.floor(x)
    frac = x - floor
    odd = (floor - 2.0 * tl.floor(floor * 0.5)) != 0.0
    v = tl.where(col_ok[None, :], tl.where((frac > 0.5) | ((frac == 0.5) & odd), floor + 1.0, floor), 0.0)
    rem0 = v * (D + 1)
    diff = elevated - rem0
    # rank i: the later coordinates above it, the earlier ones at or above it
    i = cols[None, :, None]
    j = cols[None, None, :]
    dj, di = diff[:, None, :], diff[:, :, None]
    above = (((j > i) & (dj > di)) | ((j < i) & (dj >= di))) & (j < D + 1)
    rank = tl.sum(above.to(tl.int32), axis=2) + tl.sum(v, axis=1).to(tl.int32)[:, None]
    wrap = (rank < 0).to(tl.int32) - (rank > D).to(tl.int32)
    rank += (D + 1) * wrap
    rem0_int = rem0.to(tl.int32) + (D + 1) * wrap
    # barycentric weights: slot D - rank holds the coordinate's remainder; slot p's weight is its own minus slot p-1's
    rest = (elevated - rem0_int.to(tl.float32)) * down
    slot = (D - rank)[:, None, :]
    rest_j = rest[:, None, :]
    by_slot = tl.sum(tl.where((slot == i) & (j < D + 1), rest_j, 0.0), axis=2)
    before = tl.sum(tl.where((slot == i - 1) & (j < D + 1), rest_j, 0.0), axis=2)
    last = tl.sum(tl.where((rank == 0) & col_ok[None, :], rest, 0.0), axis=1)  # slot D's
    weights = tl.where(cols[None, :] == 0, by_slot + (1.0 - last)[:, None], by_slot - before)
    out = p[:, None] * (D + 1) + cols[None, :]
    out_ok = p_ok[:, None] & col_ok[None, :]
    tl.store(rem0_ptr + out, rem0_int.to(tl.int64), mask=out_ok)
    tl.store(rank_ptr + out, rank.to(tl.int64), mask=out_ok)
    tl.store(weight_ptr + out, weights, mask=out_ok)


def is_interpreted() -> bool:
    """Whether the kernel was built for Triton's CPU interpreter (``TRITON_INTERPRET=1`` at import)."""
    return not isinstance(_product_kernel, triton.JITFunction)


def _check(tensors: list[Tensor]) -> None:
    """The kernels read raw pointers: every tensor on one device, a GPU unless interpreted."""
    devices = sorted({str(t.device) for t in tensors})
    if len(devices) > 1:
        raise ValueError(f"the CRF kernel needs its inputs on one device, got {', '.join(devices)}")
    if tensors[0].device.type != "cuda" and not is_interpreted():
        raise RuntimeError("the CRF kernel on a CPU tensor needs Triton's interpreter: set TRITON_INTERPRET=1 before "
                           "wsss.inference.crf.kernels is imported, or infer.crf.kernel='torch'")  # fmt: skip


def blocks(channels: int, softmax: bool, directions: int = 1) -> tuple[int, int]:
    """``(BLOCK_ROWS, BLOCK_CHANNELS)`` of a product over ``channels`` channels, or of a blur of ``directions``."""
    block_channels = triton.next_power_of_2(channels)
    if not softmax:
        block_channels = min(block_channels, CHANNELS)
    tile = TILE if directions == 1 else NESTED_TILE
    return min(max(tile // block_channels, ROWS_RANGE[0]), ROWS_RANGE[1]), block_channels


def product(matrix: Tensor, values: Tensor, out: Tensor, base: Tensor | None = None, softmax: bool = False,
            groups: int = 1, live: Tensor | None = None,
            second: tuple[Tensor, Tensor] | None = None) -> Tensor:  # fmt: skip
    """``out = base + matrix @ values`` (``+ matrix2 @ values2``, ``second``), and the softmax of each row of it with
    ``softmax``, in one launch.

    Args:
        matrix: ``(R, K)`` float32 sparse CSR matrix (int32 or int64 indices).
        values: ``(K', C)`` float32, contiguous, ``K' >= K``.
        out: ``(R, C)`` float32, contiguous; it may be ``base``.
        base: ``(R, C)`` float32, contiguous, or None (zeros).
        softmax: Replace each row by its softmax (at most :data:`SOFTMAX_CHANNELS` channels).
        groups: With ``softmax``, the softmax of each of this many equal groups of a row's channels on its own (the
            stacks of :func:`wsss.inference.crf.crf_labels_stacked`).
        live: A lattice's :attr:`~wsss.inference.crf.permutohedral.Lattice.live` (a (1,) integer tensor): only
            ``out``'s rows 0 to ``live`` are computed, the others left as they are; None: every row.
        second: ``(matrix2, values2)``, as ``matrix`` and ``values``, whose product is added after ``base``: the
            mean-field's two slices in one pass, each value of ``out`` the float32 sum the two products would give
            one after the other (and ``base`` read and ``out`` written once instead of twice).

    Returns:
        ``out``.
    """
    pairs = [(matrix, values)] + ([] if second is None else [second])
    dense = [out, *(v for _, v in pairs)] + ([] if base is None else [base])
    _check([*(m for m, _ in pairs), *dense] + ([] if live is None else [live]))
    rows, channels = out.shape
    for m, v in pairs:
        if v.shape[0] < m.shape[1] or v.shape[1] != channels or m.shape[0] != rows:
            raise ValueError(f"the CRF kernel cannot take {tuple(m.shape)} @ {tuple(v.shape)} into "
                             f"{tuple(out.shape)}")  # fmt: skip
    if softmax and channels > SOFTMAX_CHANNELS:
        raise ValueError(f"the CRF kernel takes the softmax of at most {SOFTMAX_CHANNELS} channels, got {channels}")
    if softmax and (groups < 1 or channels % groups):
        raise ValueError(f"the CRF kernel cannot split {channels} channels into {groups} equal groups")
    if not all(t.dtype == torch.float32 and t.is_contiguous() for t in dense) or any(
            m.dtype != torch.float32 for m, _ in pairs):  # fmt: skip
        raise ValueError("the CRF kernel needs float32 values and contiguous dense blocks")
    if rows and channels:
        block_rows, block_channels = blocks(channels, softmax)
        grid = (triton.cdiv(rows, block_rows), triton.cdiv(channels, block_channels))
        m2, v2 = pairs[-1]  # the first again when there is no second: not read
        _product_kernel[grid](matrix.crow_indices(), matrix.col_indices(), matrix.values(), values,
                              m2.crow_indices(), m2.col_indices(), m2.values(), v2,
                              out if base is None else base, out, out if live is None else live, rows, channels,
                              HAS_BASE=base is not None, HAS_SECOND=second is not None, HAS_LIVE=live is not None,
                              SOFTMAX=softmax, GROUPS=groups if softmax else 1,  # one compiled product otherwise
                              BLOCK_ROWS=block_rows, BLOCK_CHANNELS=block_channels, num_warps=NUM_WARPS)  # fmt: skip
    return out


def blur(neighbours: Tensor, values: Tensor, out: Tensor, live: Tensor | None = None) -> Tensor:
    """``out`` = one direction's blur of the lattice ``values`` (``I + (P_-1 + P_+1) / 2``, as
    :func:`wsss.inference.crf.permutohedral.build_lattice`'s CSR blur matrices), or up to :data:`CRF_BLUR_DIRECTIONS`
    directions' one after the other, in one launch, read from the neighbours themselves.

    Args:
        neighbours: ``(2, M)`` integers, each row contiguous: the first and second neighbour + 1 of each lattice
            point (0: absent); or ``(k, 2, M)``, k directions' in the order their blurs apply (the values between
            them never stored: the same float32 sums as k launches).
        values: ``(M + 1, C)`` float32, contiguous: row 0 zeros, then the points'.
        out: ``(M + 1, C)`` float32, contiguous, not ``values``.
        live: As :func:`product`'s: only rows 0 to ``live`` are blurred (their neighbours are among them), the others
            left as they are; None: every row.

    Returns:
        ``out``.
    """
    _check([neighbours, values, out] + ([] if live is None else [live]))
    rows, channels = out.shape
    grouped = neighbours if neighbours.ndim == 3 else neighbours[None]
    if (grouped.shape[1:] != (2, rows - 1) or not 1 <= len(grouped) <= CRF_BLUR_DIRECTIONS
            or values.shape != out.shape or grouped.stride(2) != 1):  # fmt: skip
        raise ValueError(f"the CRF blur kernel cannot take {tuple(neighbours.shape)} neighbours of "
                         f"{tuple(values.shape)} values into {tuple(out.shape)}")  # fmt: skip
    if not all(t.dtype == torch.float32 and t.is_contiguous() for t in (values, out)):
        raise ValueError("the CRF blur kernel needs float32 values and contiguous dense blocks")
    if rows and channels:
        block_rows, block_channels = blocks(channels, softmax=False, directions=len(grouped))
        grid = (triton.cdiv(rows, block_rows), triton.cdiv(channels, block_channels))
        _blur_kernel[grid](grouped, grouped.stride(1), grouped.stride(0), values, out, out if live is None else live,
                           rows, channels, DIRECTIONS=len(grouped), HAS_LIVE=live is not None,
                           BLOCK_ROWS=block_rows, BLOCK_CHANNELS=block_channels, num_warps=NUM_WARPS)  # fmt: skip
    return out


def simplices(features: Tensor, scales: Tensor, down: float) -> tuple[Tensor, Tensor, Tensor]:
    """``(rem0, rank, weights)`` of every point (:func:`wsss.inference.crf.permutohedral.build_lattice`'s first
    steps) in one launch.

    Args:
        features: ``(N, d)`` float32, contiguous.
        scales: ``(d,)`` float32 elevation factors, on the features' device.
        down: ``1 / (d + 1)`` in float32.

    Returns:
        ``(N, d + 1)`` int64 remainder-0 points and ranks, ``(N, d + 1)`` float32 barycentric weights.
    """
    _check([features, scales])
    n, d = features.shape
    rem0 = torch.empty(n, d + 1, dtype=torch.long, device=features.device)
    rank, weights = torch.empty_like(rem0), torch.empty(n, d + 1, dtype=torch.float32, device=features.device)
    if n:
        padded = triton.next_power_of_2(d + 1)
        block = max(1, SIMPLEX_TILE // padded**2)
        _simplex_kernel[(triton.cdiv(n, block),)](features.contiguous(), scales, rem0, rank, weights, n, down, D=d,
                                                  DP=padded, BLOCK=block, num_warps=NUM_WARPS,
                                                  enable_fp_fusion=False)  # fmt: skip
    return rem0, rank, weights
