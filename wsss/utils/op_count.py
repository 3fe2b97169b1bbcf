"""Counting the ATen operations the host dispatches: the CPU's measure of a GPU step's launch overhead.

Each operation that is not a view (``aten.slice``, ``aten.view``... cost the host a little and the GPU nothing) is, to
a first approximation, one kernel launch on a GPU. bench/op_counts.py tabulates them per stage of a training
iteration; tests/engine/test_op_counts.py holds them under ceilings.

    counter = OpCounter()
    with counter:
        with counter.stage("forward"):
            out = model(x)
    counter.counts  # {"forward": ...}
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode


def is_view(func) -> bool:
    """Whether an ATen operation returns a view of an input (no kernel on a GPU)."""
    return func.is_view or func in (torch.ops.aten.detach.default, torch.ops.aten.alias.default)


class OpCounter(TorchDispatchMode):
    """Counts the non-view ATen operations dispatched while active, per :meth:`stage` (``other`` outside any)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()
        self.current = "other"
        self.paused = False

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Count the block's operations under ``name`` (stages nest: the innermost counts)."""
        before, self.current = self.current, name
        try:
            yield
        finally:
            self.current = before

    @contextlib.contextmanager
    def pause(self) -> Iterator[None]:
        """Count nothing in the block (e.g. a graph's replay, which the host issues as one call)."""
        before, self.paused = self.paused, True
        try:
            yield
        finally:
            self.paused = before

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.paused and not is_view(func):
            self.counts[self.current] += 1
        return func(*args, **(kwargs or {}))

    def launches(self, kernel):
        """``kernel`` (a Triton kernel) with each launch counted as one operation of the current stage, and nothing of
        what Triton's CPU interpreter dispatches inside it; assign it where the kernel is looked up."""
        counter = self

        class Counted:
            def __getitem__(self, grid):
                launch = kernel[grid]

                def run(*args, **kwargs):
                    if not counter.paused:
                        counter.counts[counter.current] += 1
                    with counter.pause():
                        return launch(*args, **kwargs)

                return run

        return Counted()
