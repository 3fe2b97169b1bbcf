"""Helpers shared by the benchmark scripts (run as ``python bench/<script>.py``, so this folder is on the path)."""

from __future__ import annotations

import statistics
import time

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile


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


def kernel_times(fn, device: torch.device) -> list[tuple[str, int, float]]:
    """(name, calls, seconds) of each kernel one eager call of ``fn`` ran on ``device`` (on a CPU each operator's own
    time), the longest first; after one untimed call."""
    cuda = device.type == "cuda"
    fn()
    synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]) as prof:
        fn()
        synchronize(device)
    wanted = DeviceType.CUDA if cuda else DeviceType.CPU
    rows = [(e.key, e.count, (e.self_device_time_total if cuda else e.self_cpu_time_total) / 1e6)
            for e in prof.key_averages() if e.device_type == wanted]  # fmt: skip
    return sorted(rows, key=lambda row: -row[2])


def print_kernels(label: str, rows: list[tuple[str, int, float]], top: int, cuda: bool, whole: float | None = None,
                  whole_name: str = "") -> None:  # fmt: skip
    """One call's :func:`kernel_times`: the count and sum of all (against ``whole`` seconds, ``whole_name``'s time,
    where given: the GPU's busy share of it), then the ``top`` longest."""
    what = "kernels" if cuda else "operators (a CPU's: their own time)"
    busy = sum(seconds for _, _, seconds in rows)
    against = f", {busy / whole:.0%} of {whole_name} {whole * 1e3:.2f} ms" if whole else ""
    print(f"\n{label}: {sum(calls for _, calls, _ in rows)} {what}, {busy * 1e3:.2f} ms summed{against}")
    print("| kernel | calls | ms | share |\n|---|---:|---:|---:|")
    for name, calls, seconds in rows[:top]:
        name = name if len(name) <= 90 else name[:87] + "..."
        print(f"| `{name}` | {calls} | {seconds * 1e3:.3f} | {seconds / busy:.0%} |")
