"""Fused exact Gaussian filtering ``W S`` in one Triton kernel, without storing any tile of ``W``.

``out_i = sum_j exp(-|f_i - f_j|^2 / 2) v_j``, the contract of :func:`wsss.losses.gaussian_filter_dense`,
evaluated flash-attention style: each program owns ``BLOCK_ROWS`` rows ``i`` and loops over blocks of
``BLOCK_COLS`` columns ``j``. Per column block it loads ``f_j`` and ``v_j``, forms the exponents in
float32 registers from the feature differences (per pair ``D`` subtractions and ``D`` fused multiply-adds;
no matmul expansion ``|a|^2 + |b|^2 - 2 a.b``, hence no cancellation), exponentiates, and multiplies the
``(BLOCK_ROWS, BLOCK_COLS)`` weight tile with ``v_j`` on tensor cores into a float32 accumulator. The
tile lives only in registers; global memory holds the features, the values and the output.

Precision:
- Features are mean-centred and multiplied by ``sqrt(log2(e) / 2)`` in float64 on the host, then
  rounded once to float32, so the kernel computes ``W_ij = exp2(-|f'_i - f'_j|^2)``. A common offset
  (pixel coordinates of a large image) costs no precision; each stored feature errs by at most 2^-24 of
  its centred magnitude, each difference and square by float32 rounding.
- ``exp2`` is the hardware approximation (``ex2.approx``, about 2 ulp).
- The product with ``v`` is 3xTF32-style, with the split written out: ``W`` (in the kernel) and ``v`` (on
  the host, :func:`split_tf32`) are each split into a TF32 value and a TF32 remainder, ``x = hi + lo`` to
  2^-22 relative, and two TF32 tensor-core products ``W_hi [v_hi | v_lo]`` and ``W_lo [v_hi | v_lo]`` give
  all four partial products, summed in float32. Every operand is exactly a TF32 value and the product of
  two TF32 values is exact in float32, so the tensor cores round nothing but the float32 accumulation:
  float32 accuracy on tensor cores. Triton's own ``input_precision="tf32x3"`` does the same split (without
  the remainder product); compiled for sm_90 (Triton 3.8) it computed the exponent tile a second time in
  another register layout for its shared-memory operand: two ``exp2`` per pair, 255 registers per thread
  and spills. This version compiles to 129 registers, no spills, one ``exp2`` per pair and both products
  as ``wgmma`` with ``W`` in registers (``triton.compile`` for ``GPUTarget("cuda", 90, 32)``, which needs
  no GPU, then Triton's bundled ``ptxas -v --gpu-name sm_90a``; 128 x 64 blocks, 8 warps, K <= 32).
  ``"tf32"`` alone would round ``W`` and ``v`` to 2^-11; ``"ieee"`` would not use tensor cores.
- Triton's interpreter (``TRITON_INTERPRET=1``, how the tests run this on the CPU) multiplies in IEEE
  float32; with TF32-exact operands that gives the same partial products as the tensor cores, so the
  interpreter tests cover the split, and only the order of the float32 accumulation differs on a GPU.

Masking: the row and column tails of ``n`` are masked (loads give feature 0 and value 0, so a masked
column has a finite weight times a zero value and adds exactly 0; masked rows are not stored). ``K`` is
padded on the host to a power of two >= 16 (``tl.dot``'s smallest edge) with zero columns, dropped from
the output.

The kernel does not use the symmetry of ``W`` (the blocked version computes each off-diagonal tile once
for both of its blocks): every pair costs one ``exp2`` here, against half of one there, in exchange for
no ``n x n`` or tile buffer in memory and a single pass over the features.

Whether Triton compiles or interprets is decided when ``@triton.jit`` runs, i.e. when this module is
first imported: set ``TRITON_INTERPRET=1`` before that to run the kernel on CPU tensors.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

# Block edges for an H100: a 128 x 64 float32 weight tile is 32 entries per thread at 8 warps (two
# warpgroups of 64 rows, the wgmma M), the tile shape of Triton's flash-attention tutorial on Hopper;
# 128-row programs give ceil(50,176 / 128) = 392 programs per 224 x 224 image, about 3 waves on 132 SMs.
# Chosen from the compiled register use (module docstring); the interpreter's blocks, and the first of
# TUNED_BLOCKS, which Triton's autotuner times against others on a GPU.
BLOCK_ROWS = 128
BLOCK_COLS = 64
NUM_WARPS = 8
MIN_DOT_EDGE = 16  # smallest edge of a tl.dot operand
EXP2_SCALE = math.sqrt(0.5 * math.log2(math.e))  # exp(-x^2 / 2) = exp2(-(EXP2_SCALE x)^2)
TF32_HALF_ULP = tl.constexpr(0x1000)  # added to the float32 bits before truncation: round to nearest
TF32_KEEP = tl.constexpr(-0x2000)  # bit mask: sign, exponent and the 10 mantissa bits of TF32


@triton.jit
def _round_tf32(x):
    """Float32 ``x`` rounded to the nearest TF32 value (ties away from zero), as float32."""
    return ((x.to(tl.int32, bitcast=True) + TF32_HALF_ULP) & TF32_KEEP).to(tl.float32, bitcast=True)


def round_tf32(x: Tensor) -> Tensor:
    """Float32 ``x`` rounded to the nearest TF32 value (ties away from zero), as float32; the host twin
    of the kernel's rounding."""
    return ((x.view(torch.int32) + TF32_HALF_ULP.value) & TF32_KEEP.value).view(torch.float32)


def split_tf32(x: Tensor) -> tuple[Tensor, Tensor]:
    """``(hi, lo)``, both TF32 values, ``hi = round_tf32(x)``, ``lo = round_tf32(x - hi)``, so that
    ``|x - hi - lo| <= 2^-22 |x|`` (``x - hi`` is exact in float32)."""
    hi = round_tf32(x)
    return hi, round_tf32(x - hi)


@triton.jit
def _gaussian_filter_kernel(
    feat_ptr,
    val_ptr,
    out_ptr,
    n,
    D: tl.constexpr,
    K2: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_COLS: tl.constexpr,
):
    """``out[i] = sum_j exp2(-|f_i - f_j|^2) val[j]`` for the ``BLOCK_ROWS`` rows of this program.

    ``feat_ptr``: ``(D, n)`` scaled features; ``val_ptr``: ``(n, K2)`` TF32 values (the two halves of
    :func:`split_tf32` side by side); ``out_ptr``: ``(n, K2)``; all float32, contiguous.
    """
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    row_ok = rows < n
    ks = tl.arange(0, K2)
    acc = tl.zeros((BLOCK_ROWS, K2), dtype=tl.float32)
    for col0 in range(0, n, BLOCK_COLS):
        cols = col0 + tl.arange(0, BLOCK_COLS)
        col_ok = cols < n
        neg_sq = tl.zeros((BLOCK_ROWS, BLOCK_COLS), dtype=tl.float32)
        for d in tl.static_range(D):
            f_i = tl.load(feat_ptr + d * n + rows, mask=row_ok, other=0.0)
            f_j = tl.load(feat_ptr + d * n + cols, mask=col_ok, other=0.0)
            diff = f_i[:, None] - f_j[None, :]
            neg_sq -= diff * diff
        w = tl.exp2(neg_sq)
        # w = w_hi + rest exactly. Writing w_hi = w - rest (not reusing the rounded value for both) keeps
        # each product operand single-use, which lets Triton feed both to wgmma from registers.
        rest = w - _round_tf32(w)
        w_hi = w - rest
        w_lo = _round_tf32(rest)
        v = tl.load(val_ptr + cols[:, None] * K2 + ks[None, :], mask=col_ok[:, None], other=0.0)
        acc = tl.dot(w_lo, v, acc, input_precision="tf32")
        acc = tl.dot(w_hi, v, acc, input_precision="tf32")
    tl.store(out_ptr + rows[:, None] * K2 + ks[None, :], acc, mask=row_ok[:, None])


def is_interpreted() -> bool:
    """Whether the kernel was built for Triton's CPU interpreter (``TRITON_INTERPRET=1`` at import)."""
    return not isinstance(_gaussian_filter_kernel, triton.JITFunction)


TUNED_BLOCKS = (
    (BLOCK_ROWS, BLOCK_COLS, NUM_WARPS, 1, None),
    (BLOCK_ROWS, BLOCK_COLS, NUM_WARPS, 2, None),
    (128, 32, 4, 2, None),
    (64, 64, 4, 2, None),
    (64, 128, 4, 2, None),
    (128, 128, 8, 2, None),
    (BLOCK_ROWS, BLOCK_COLS, NUM_WARPS, 2, 128),
    (64, 64, 4, 2, 128),
    (128, 32, 4, 2, 168),
    (128, 32, 8, 1, None),
    (64, 32, 4, 1, None),
)
"""``(BLOCK_ROWS, BLOCK_COLS, num_warps, num_stages, maxnreg)`` that Triton's autotuner times on a GPU at the first call
for each ``(n, D, K)``, keeping the fastest (a configuration that does not fit the chip is skipped). Every one computes
the same sums, in another order. ``maxnreg`` caps the registers per thread (None: as ptxas chooses). The last five are
for occupancy, compiled for sm_90a (``bench/kernel_registers.py``, whose test fails on a spill): the 128 x 64 tile at 8
warps takes 129 registers, one more than lets an SM hold two of its programs, so an SM runs 8 of its warps at once;
capped at 128 it holds 16, without spilling; the last two hold 16 and, with one stage, keep their ``wgmma`` unserialised
(no ptxas warning C7515: the 128 x 64 tile's wait for each product before the next)."""
_tuned_kernel = None


def _tuned():
    """The kernel behind Triton's autotuner over :data:`TUNED_BLOCKS` (made at the first compiled call)."""
    global _tuned_kernel
    if _tuned_kernel is None:
        configs = [triton.Config({"BLOCK_ROWS": r, "BLOCK_COLS": c}, num_warps=w, num_stages=st, maxnreg=reg)
                   for r, c, w, st, reg in TUNED_BLOCKS]  # fmt: skip
        _tuned_kernel = triton.autotune(configs=configs, key=["n", "D", "K2"])(_gaussian_filter_kernel)
    return _tuned_kernel


def gaussian_filter_fused(
    features: Tensor,
    values: Tensor,
    block_rows: int | None = None,
    block_cols: int = BLOCK_COLS,
    num_warps: int = NUM_WARPS,
) -> Tensor:
    """Exact Gaussian filtering ``out_i = sum_j exp(-|f_i - f_j|^2 / 2) v_j`` in one fused Triton kernel.

    Same contract as :func:`wsss.losses.gaussian_filter_dense`; precision and blocking in the module
    docstring. CUDA tensors run the compiled kernel; CPU tensors need the interpreter
    (:func:`is_interpreted`).

    Args:
        features: ``(n, D)`` point features already divided by their bandwidths.
        values: ``(n, K)`` values to filter.
        block_rows: Rows per program (power of two >= 16); None: on a GPU the fastest of :data:`TUNED_BLOCKS`
            (``block_cols`` and ``num_warps`` then ignored), in the interpreter :data:`BLOCK_ROWS`.
        block_cols: Columns per loop step (power of two >= 16).
        num_warps: Warps per program.

    Returns:
        ``(n, K)`` float32.
    """
    if features.device.type != "cuda" and not is_interpreted():
        raise RuntimeError(
            "gaussian_filter_fused on a CPU tensor needs Triton's interpreter: set TRITON_INTERPRET=1 before "
            "wsss.energy_kernel is imported"
        )
    n, d = features.shape
    k = values.shape[1]
    k_pad = max(MIN_DOT_EDGE, triton.next_power_of_2(k))
    with torch.no_grad():
        f = features.double()
        f = ((f - f.mean(dim=0, keepdim=True)) * EXP2_SCALE).float().T.contiguous()
        v = torch.zeros(n, k_pad, dtype=torch.float32, device=values.device)
        v[:, :k] = values
        v = torch.cat(split_tf32(v), dim=1)
        out = torch.empty_like(v)
        if n > 0 and block_rows is None and not is_interpreted():
            _tuned()[lambda meta: (triton.cdiv(n, meta["BLOCK_ROWS"]),)](f, v, out, n, D=d, K2=2 * k_pad)
        elif n > 0:
            rows = block_rows or BLOCK_ROWS
            _gaussian_filter_kernel[(triton.cdiv(n, rows),)](
                f, v, out, n, D=d, K2=2 * k_pad, BLOCK_ROWS=rows, BLOCK_COLS=block_cols, num_warps=num_warps
            )
    return out[:, :k] + out[:, k_pad : k_pad + k]
