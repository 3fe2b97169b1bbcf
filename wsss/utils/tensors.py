"""Tensor operations where torch's own is slow on the CPU, and the precision of a GPU's products."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import Tensor

from wsss.config import FP32_PRECISIONS

__all__ = ["argmax", "fp32_precision", "fp32_products", "model_dtype", "model_precision", "to_device"]


def argmax(x: Tensor, dim: int) -> Tensor:
    """``x.argmax(dim)``, the same indices (the first of tied maxima; a NaN wins), through ``x.max(dim)``: on the
    CPU torch's argmax along any but the last dimension is several times slower (a (7, 375, 500) mask: 15.7 ms
    against 1.8; (4, 21, 448, 448) over dim 1: 146 against 26; 2 threads). On CUDA the two are not compared."""
    return x.max(dim=dim).indices


def to_device(x: Tensor, device: torch.device | str) -> Tensor:
    """A host tensor (an image, an index, a mask) on ``device`` without making the host wait for the device: a
    ``non_blocking`` copy (a blocking one waits for the device's queued work, a CUDA sync) from page-locked memory.

    To a GPU, a tensor in pageable memory is first copied into a pinned one (``Tensor.pin_memory``: a host copy into
    PyTorch's caching host allocator, which keeps the block until the copy's stream has read it): from pageable
    memory CUDA stages the copy through a buffer of its own and may wait for the stream to do so."""
    device = torch.device(device)
    if device.type == "cuda" and x.device.type == "cpu" and not x.is_pinned():
        x = x.pin_memory()
    return x.to(device, non_blocking=True)


@contextlib.contextmanager
def fp32_precision(mode: str) -> Iterator[None]:
    """Float32 matrix products (cuBLAS) and convolutions (cuDNN) on a GPU in ``mode`` while the block runs, the
    earlier setting after it: ``"tf32"`` (tensor cores: each operand rounded to TF32's 10 mantissa bits, the sums in
    float32; what PyTorch 1.7-1.11 did by default on Ampere and later GPUs) or ``"ieee"`` (float32 throughout).
    Nothing changes on a CPU.

    Set through the ``allow_tf32`` flags, which every supported torch has; torch 2.9's ``fp32_precision`` attributes
    raise where a process mixes the two kinds of setting, so the project uses these alone."""
    if mode not in FP32_PRECISIONS:
        raise ValueError(f"fp32 precision must be one of {FP32_PRECISIONS}, got {mode!r}")
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = mode == "tf32"
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def fp32_products(mode: str, device: torch.device | str) -> str | None:
    """What ``fp32_precision(mode)`` makes of ``device``'s float32 products, as a run records it: ``mode`` on a GPU,
    None on a CPU (IEEE whatever the mode)."""
    return mode if torch.device(device).type == "cuda" else None


def model_dtype(dtype: str, device: torch.device | str) -> str:
    """What ``infer.dtype`` makes of the model on ``device``, as a run records it: ``dtype`` on a GPU, ``"float32"`` on
    a CPU (where the setting is ignored)."""
    return dtype if torch.device(device).type == "cuda" else "float32"


@contextlib.contextmanager
def model_precision(mode: str, dtype: str, device: torch.device | str) -> Iterator[None]:
    """A model at inference on ``device``: its float32 products as :func:`fp32_precision` ``(mode)`` says, and with
    ``dtype="bfloat16"`` on a GPU under bf16 autocast (``infer.fp32_precision``, ``infer.dtype``)."""
    bf16 = model_dtype(dtype, device) == "bfloat16"
    with fp32_precision(mode), torch.autocast("cuda", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
        yield
