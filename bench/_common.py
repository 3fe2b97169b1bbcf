"""Helpers shared by the benchmark scripts (run as ``python bench/<script>.py``, so this folder is on the path)."""

from __future__ import annotations

import statistics
import time

import torch


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so a wall-clock reading covers it (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def rss_bytes(field: str) -> int:
    """``VmRSS`` (current) or ``VmHWM`` (peak) resident memory of this process, in bytes (Linux)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def timed(fn, repeats: int, device: torch.device) -> tuple[float, object]:
    """Median seconds of ``fn()`` over ``repeats`` calls (after one warm-up call) and its last result."""
    out = fn()
    times = []
    for _ in range(repeats):
        synchronize(device)
        tic = time.perf_counter()
        out = fn()
        synchronize(device)
        times.append(time.perf_counter() - tic)
    return statistics.median(times), out
