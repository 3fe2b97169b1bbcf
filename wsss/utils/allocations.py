"""The most memory a call holds at once, as the device's allocator counts it: the CPU's measure of a GPU call's memory.

On CUDA it is ``torch.cuda.max_memory_allocated`` above what was allocated before the call. On the CPU it is summed
from the profiler's memory events (every allocation and release of PyTorch's CPU allocator, in order), so a code path
that runs on the CPU as it would on a GPU (the CRF's Triton path with its kernels interpreted) is measured without
one: what a GPU's allocator would hold, less its rounding of each block to 512 bytes.

    peak = peak_allocated(lambda: dense_crf(image, probs, cfg), probs.device)  # bytes
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._C._autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

__all__ = ["SkippedLaunches", "peak_allocated"]


def peak_allocated(run: Callable[[], Any], device: torch.device | str = "cpu") -> int:
    """Bytes: the most that tensors made during ``run()`` on ``device`` held at once (its result included while it
    was held); tensors made before it are not counted."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        run()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    if device.type != "cpu":
        raise ValueError(f"peak_allocated measures the CPU or a CUDA device, not {device}")
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    events = [e for e in prof.profiler.kineto_results.events()
              if e.name() == "[memory]" and e.device_type() == DeviceType.CPU]  # fmt: skip
    held = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        held += event.nbytes()
        peak = max(peak, held)
    return peak


class SkippedLaunches:
    """Stands for a Triton kernel whose launches (``kernel[grid](...)``) do nothing: to measure the memory of a code
    path whose kernels only write into tensors made before them, without running them (bench/bench_crf.py
    ``--memory``: the CRF's products in Triton's interpreter would take minutes)."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None
