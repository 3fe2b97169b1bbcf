"""PAR (:mod:`wsss.par`) in Triton kernels: the affinities in one launch, each propagation step in one more.

The PyTorch version dispatches one operation per neighbour and step (10 steps x 48 neighbours of ``addcmul_``, plus
33 for the padding and the affinities): 513 kernel launches per call of the paper's PAR on a GPU. Here:

- :func:`affinity`: one program per ``BLOCK`` pixels of one image holds the ``(BLOCK, K)`` neighbour tile in
  registers, per colour channel loads the neighbours' values (coordinates clamped to the image: the replicate padding
  of the PyTorch version), takes their mean and unbiased standard deviation, adds the channel's colour score, then
  takes the softmax over the K neighbours and adds the position term. Nothing but the ``(B, K, H, W)`` affinities is
  written.
- :func:`propagate`: per step, one program per ``BLOCK`` pixels, ``BLOCK_CHANNELS`` channels of one image sums its K
  neighbours' values times their affinities, in the neighbours' order, from 0 (the order of the PyTorch loop).

Both compute in float32 as the PyTorch version does, with the same formulas in the same order; what differs is
rounding: the standard deviation by two passes where PyTorch may use another reduction, a fused multiply-add where
PyTorch may round the product first. Tests (``tests/test_par_kernel.py``, in Triton's CPU interpreter) hold both
within float32 tolerance of :class:`wsss.par.PAR`'s PyTorch path and of a float64 pixel loop.

Whether Triton compiles or interprets is decided when this module is first imported (``TRITON_INTERPRET=1`` before
that runs the kernels on CPU tensors), as for :mod:`wsss.energy_kernel`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

# Blocks from the compiled register use (bench/kernel_registers.py: compiled for sm_90a without a GPU, 48 neighbours).
# The affinities' (pixels, 64) tile: 32 pixels at 4 warps take 162 registers per thread, no spills (64 pixels at 4
# warps or 128 at 8 spill at 255). A propagation step: 128 pixels x 16 channels at 8 warps take 64 registers (115 at 4
# warps), no spills.
AFFINITY_BLOCK = 32
"""Pixels per affinity program."""
AFFINITY_WARPS = 4
BLOCK = 128
"""Pixels per propagation program."""
BLOCK_CHANNELS = 16
"""Channels per propagation program at most (fewer when the maps have fewer)."""
NUM_WARPS = 8
"""Warps per propagation program."""


@triton.jit
def _affinity_kernel(
    image_ptr, dy_ptr, dx_ptr, position_ptr, out_ptr, height, width, w1, eps,
    K: tl.constexpr, KP: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """``out[b, k, p]``: the affinity of pixel ``p`` of image ``b`` to its neighbour ``k`` (``PAR.affinity``).

    ``image_ptr``: ``(B, 3, H, W)`` float32; ``dy_ptr``, ``dx_ptr``: ``(K,)`` int32 offsets; ``position_ptr``: ``(K,)``
    float32 position term; ``out_ptr``: ``(B, K, H, W)`` float32. ``KP``: K rounded up to a power of two.
    """
    b = tl.program_id(1).to(tl.int64)
    pixels = height * width
    p = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    p_ok = p < pixels
    y, x = p // width, p % width
    k = tl.arange(0, KP)
    k_ok = k < K
    dy = tl.load(dy_ptr + k, mask=k_ok, other=0)
    dx = tl.load(dx_ptr + k, mask=k_ok, other=0)
    ny = tl.minimum(tl.maximum(y[:, None] + dy[None, :], 0), height - 1)
    nx = tl.minimum(tl.maximum(x[:, None] + dx[None, :], 0), width - 1)
    neighbour = ny * width + nx
    tile_ok = p_ok[:, None] & k_ok[None, :]
    score = tl.zeros((BLOCK, KP), dtype=tl.float32)
    for c in tl.static_range(3):
        plane = image_ptr + (b * 3 + c) * pixels
        centre = tl.load(plane + p, mask=p_ok, other=0.0)
        values = tl.load(plane + neighbour, mask=tile_ok, other=0.0)
        mean = tl.sum(values, axis=1) / K
        spread = tl.where(k_ok[None, :], values - mean[:, None], 0.0)
        std = tl.sqrt(tl.sum(spread * spread, axis=1) / (K - 1))
        term = tl.abs(values - centre[:, None]) / (std[:, None] + eps) / w1
        score += -(term * term)
    score = tl.where(k_ok[None, :], score / 3, float("-inf"))
    top = tl.max(score, axis=1)
    e = tl.exp(score - top[:, None])
    softmax = e / tl.sum(e, axis=1)[:, None]
    position = tl.load(position_ptr + k, mask=k_ok, other=0.0)
    out = out_ptr + (b * K + k[None, :]) * pixels + p[:, None]
    tl.store(out, softmax + position[None, :], mask=tile_ok)


@triton.jit
def _propagate_kernel(
    masks_ptr, affinity_ptr, dy_ptr, dx_ptr, out_ptr, height, width, channels,
    K: tl.constexpr, BLOCK: tl.constexpr, BLOCK_CHANNELS: tl.constexpr,
):  # fmt: skip
    """One step ``out[b, c, p] = sum_k affinity[b, k, p] * masks[b, c, neighbour_k(p)]`` (``PAR.propagate``).

    ``masks_ptr``, ``out_ptr``: ``(B, C, H, W)`` float32; ``affinity_ptr``: ``(B, K, H, W)`` float32; offsets as in
    :func:`_affinity_kernel`. Grid: (pixel blocks, B, channel blocks).
    """
    b = tl.program_id(1).to(tl.int64)
    pixels = height * width
    p = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    p_ok = p < pixels
    y, x = p // width, p % width
    c = tl.program_id(2) * BLOCK_CHANNELS + tl.arange(0, BLOCK_CHANNELS)
    tile_ok = p_ok[:, None] & (c < channels)[None, :]
    planes = masks_ptr + (b * channels + c[None, :]) * pixels
    acc = tl.zeros((BLOCK, BLOCK_CHANNELS), dtype=tl.float32)
    for k in range(K):
        ny = tl.minimum(tl.maximum(y + tl.load(dy_ptr + k), 0), height - 1)
        nx = tl.minimum(tl.maximum(x + tl.load(dx_ptr + k), 0), width - 1)
        a = tl.load(affinity_ptr + (b * K + k) * pixels + p, mask=p_ok, other=0.0)
        acc += a[:, None] * tl.load(planes + (ny * width + nx)[:, None], mask=tile_ok, other=0.0)
    tl.store(out_ptr + (b * channels + c[None, :]) * pixels + p[:, None], acc, mask=tile_ok)


def is_interpreted() -> bool:
    """Whether the kernels were built for Triton's CPU interpreter (``TRITON_INTERPRET=1`` at import)."""
    return not isinstance(_propagate_kernel, triton.JITFunction)


def _check(*tensors: Tensor) -> None:
    """The kernels read raw pointers: every tensor on the first one's device, a GPU unless interpreted."""
    if tensors[0].device.type != "cuda" and not is_interpreted():
        raise RuntimeError("the PAR kernels on a CPU tensor need Triton's interpreter: set TRITON_INTERPRET=1 before "
                           "wsss.par_kernel is imported, or par.kernel='torch'")  # fmt: skip
    devices = [str(t.device) for t in tensors]
    if len(set(devices)) > 1:
        raise ValueError(f"the PAR kernels need their inputs on one device, got {', '.join(devices)}: move the PAR "
                         "module to the images' device (PAR.to(device))")  # fmt: skip


def affinity(images: Tensor, dy: Tensor, dx: Tensor, position: Tensor, w1: float, eps: float) -> Tensor:
    """:meth:`wsss.par.PAR.affinity` in one kernel.

    Args:
        images: ``(B, 3, H, W)`` guidance images.
        dy, dx: ``(K,)`` int32 neighbour offsets (:class:`wsss.par.PAR`'s buffers).
        position: ``(K,)`` float32 position term, already weighted by ``w2``.
        w1: Temperature of the colour term.
        eps: Added to each standard deviation.

    Returns:
        ``(B, K, H, W)`` float32.
    """
    _check(images, dy, dx, position)
    b, _, h, w = images.shape
    k = dy.numel()
    images = images.float().contiguous()
    out = torch.empty(b, k, h, w, dtype=torch.float32, device=images.device)
    if out.numel():
        grid = (triton.cdiv(h * w, AFFINITY_BLOCK), b)
        _affinity_kernel[grid](images, dy, dx, position, out, h, w, w1, eps, K=k, KP=triton.next_power_of_2(k),
                               BLOCK=AFFINITY_BLOCK, num_warps=AFFINITY_WARPS)  # fmt: skip
    return out


def propagate(affinity: Tensor, masks: Tensor, dy: Tensor, dx: Tensor, num_iter: int) -> Tensor:
    """:meth:`wsss.par.PAR.propagate`, one kernel per step.

    Args:
        affinity: ``(B, K, H, W)`` float32 from :func:`affinity`.
        masks: ``(B, C, H, W)``.
        dy, dx: ``(K,)`` int32 neighbour offsets.
        num_iter: Steps.

    Returns:
        ``(B, C, H, W)`` float32.
    """
    _check(masks, affinity, dy, dx)
    b, c, h, w = masks.shape
    k = dy.numel()
    src = masks.float().contiguous()
    if num_iter == 0 or src.numel() == 0:
        return src.clone()
    affinity = affinity.contiguous()
    channels = min(BLOCK_CHANNELS, triton.next_power_of_2(c))
    grid = (triton.cdiv(h * w, BLOCK), b, triton.cdiv(c, channels))
    buffers = [torch.empty_like(src), torch.empty_like(src)] if num_iter > 1 else [torch.empty_like(src)]
    for step in range(num_iter):
        dst = buffers[step % len(buffers)]
        _propagate_kernel[grid](src, affinity, dy, dx, dst, h, w, c,
                                K=k, BLOCK=BLOCK, BLOCK_CHANNELS=channels, num_warps=NUM_WARPS)  # fmt: skip
        src = dst
    return src
