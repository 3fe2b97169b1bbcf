"""The dense CRF's sparse products (:mod:`wsss.inference.crf.permutohedral`) as one Triton kernel.

A mean-field iteration filters the marginals through each lattice: a splat (lattice points <- pixels, CSR rows of any
length), one blur per lattice direction (three entries per row) and a slice (pixels <- their d+1 vertices), each a
product of a CSR matrix with a dense (rows, C) block. On a GPU PyTorch runs each through cuSPARSE, which queries and
allocates its buffer at every call, and the mean-field adds a copy of the prior before the slices and a softmax after
them. :func:`product` is all of these in one kernel: a program holds a tile of ``BLOCK_ROWS`` rows and
``BLOCK_CHANNELS`` channels, walks each row's entries in their stored order (from 0, as a CSR product sums), adds
``base`` and, when asked, takes the softmax of each row, so one iteration of the paper's CRF is 13 launches (a splat,
3 + 6 blurs and a slice per lattice, the last slice with the prior and the softmax) and reads each value once per
product.

Float32 throughout, as the PyTorch path; what differs is rounding (a fused multiply-add where a sparse library may
round the product first, and a library's own order of a row's entries): ``tests/inference/test_crf_kernels.py`` holds
the kernels within float32 tolerance of the PyTorch path and the whole CRF's labels equal to it.

Whether Triton compiles or interprets is decided when this module is first imported (``TRITON_INTERPRET=1`` before
that runs the kernels on CPU tensors), as for :mod:`wsss.energy_kernel`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

# Blocks from the compiled register use (bench/kernel_registers.py: compiled for sm_90a without a GPU).
TILE = 1024
"""Values per program: ``BLOCK_ROWS`` = this / ``BLOCK_CHANNELS``, within ``ROWS_RANGE``."""
ROWS_RANGE = (8, 256)
CHANNELS = 32
"""Channels per program at most, unless the program takes the rows' softmax (then all of a row's channels)."""
SOFTMAX_CHANNELS = 128
"""The most channels whose softmax the product takes in its own program; wider rows take it apart."""
NUM_WARPS = 8


@triton.jit
def _product_kernel(
    crow_ptr, col_ptr, val_ptr, x_ptr, base_ptr, out_ptr, rows, channels,
    HAS_BASE: tl.constexpr, SOFTMAX: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_CHANNELS: tl.constexpr,
):  # fmt: skip
    """``out[r] = softmax?(base[r] + sum_e val[e] x[col[e]])`` over the entries ``e`` of CSR row ``r`` in order.

    ``crow_ptr``: ``(rows + 1,)`` row offsets; ``col_ptr``, ``val_ptr``: the entries' columns and float32 values;
    ``x_ptr``: ``(*, channels)`` float32; ``base_ptr``, ``out_ptr``: ``(rows, channels)`` float32 (``base_ptr`` may
    be ``out_ptr``: each value is read before the program writes it). Grid: (row blocks, channel blocks).
    """
    r = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    r_ok = r < rows
    c = tl.program_id(1) * BLOCK_CHANNELS + tl.arange(0, BLOCK_CHANNELS)
    c_ok = c < channels
    start = tl.load(crow_ptr + r, mask=r_ok, other=0)
    count = tl.load(crow_ptr + r + 1, mask=r_ok, other=0) - start
    acc = tl.zeros((BLOCK_ROWS, BLOCK_CHANNELS), dtype=tl.float32)
    for k in range(tl.max(count, axis=0)):  # the block's longest row; shorter rows are masked
        entry_ok = k < count
        col = tl.load(col_ptr + start + k, mask=entry_ok, other=0).to(tl.int64)
        val = tl.load(val_ptr + start + k, mask=entry_ok, other=0.0)
        x = tl.load(x_ptr + col[:, None] * channels + c[None, :], mask=entry_ok[:, None] & c_ok[None, :], other=0.0)
        acc += val[:, None] * x
    tile = r.to(tl.int64)[:, None] * channels + c[None, :]
    tile_ok = r_ok[:, None] & c_ok[None, :]
    if HAS_BASE:
        acc = tl.load(base_ptr + tile, mask=tile_ok, other=0.0) + acc
    if SOFTMAX:  # the program holds every channel of its rows
        acc = tl.where(c_ok[None, :], acc, float("-inf"))
        e = tl.exp(acc - tl.max(acc, axis=1)[:, None])
        acc = e / tl.sum(e, axis=1)[:, None]
    tl.store(out_ptr + tile, acc, mask=tile_ok)


def is_interpreted() -> bool:
    """Whether the kernel was built for Triton's CPU interpreter (``TRITON_INTERPRET=1`` at import)."""
    return not isinstance(_product_kernel, triton.JITFunction)


def blocks(channels: int, softmax: bool) -> tuple[int, int]:
    """``(BLOCK_ROWS, BLOCK_CHANNELS)`` of a product over ``channels`` channels."""
    block_channels = triton.next_power_of_2(channels)
    if not softmax:
        block_channels = min(block_channels, CHANNELS)
    return min(max(TILE // block_channels, ROWS_RANGE[0]), ROWS_RANGE[1]), block_channels


def product(matrix: Tensor, values: Tensor, out: Tensor, base: Tensor | None = None, softmax: bool = False) -> Tensor:
    """``out = base + matrix @ values``, and the softmax of each row of it with ``softmax``, in one launch.

    Args:
        matrix: ``(R, K)`` float32 sparse CSR matrix (int32 or int64 indices).
        values: ``(K', C)`` float32, contiguous, ``K' >= K``.
        out: ``(R, C)`` float32, contiguous; it may be ``base``.
        base: ``(R, C)`` float32, contiguous, or None (zeros).
        softmax: Replace each row by its softmax (at most :data:`SOFTMAX_CHANNELS` channels).

    Returns:
        ``out``.
    """
    tensors = [matrix, values, out] + ([] if base is None else [base])
    devices = {str(t.device) for t in tensors}
    if len(devices) > 1:
        raise ValueError(f"the CRF kernel needs its inputs on one device, got {', '.join(sorted(devices))}")
    if matrix.device.type != "cuda" and not is_interpreted():
        raise RuntimeError("the CRF kernel on a CPU tensor needs Triton's interpreter: set TRITON_INTERPRET=1 before "
                           "wsss.inference.crf.kernels is imported, or infer.crf.kernel='torch'")  # fmt: skip
    rows, channels = out.shape
    if values.shape[0] < matrix.shape[1] or values.shape[1] != channels or matrix.shape[0] != rows:
        raise ValueError(f"the CRF kernel cannot take {tuple(matrix.shape)} @ {tuple(values.shape)} into "
                         f"{tuple(out.shape)}")  # fmt: skip
    if softmax and channels > SOFTMAX_CHANNELS:
        raise ValueError(f"the CRF kernel takes the softmax of at most {SOFTMAX_CHANNELS} channels, got {channels}")
    if not all(t.dtype == torch.float32 and t.is_contiguous() for t in tensors[1:]) or matrix.dtype != torch.float32:
        raise ValueError("the CRF kernel needs float32 values and contiguous dense blocks")
    if rows and channels:
        block_rows, block_channels = blocks(channels, softmax)
        grid = (triton.cdiv(rows, block_rows), triton.cdiv(channels, block_channels))
        _product_kernel[grid](matrix.crow_indices(), matrix.col_indices(), matrix.values(), values,
                              out if base is None else base, out, rows, channels, HAS_BASE=base is not None,
                              SOFTMAX=softmax, BLOCK_ROWS=block_rows, BLOCK_CHANNELS=block_channels,
                              num_warps=NUM_WARPS)  # fmt: skip
    return out
