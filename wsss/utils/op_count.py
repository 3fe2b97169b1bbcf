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


_STAGING = (torch.ops.aten._pin_memory.default, torch.ops.aten.is_pinned.default)


def is_transfer(func, args: tuple, kwargs: dict) -> bool:
    """Whether an ATen operation copies between the host and a device, or stages host memory for such a copy (a
    device's copy engine or the host, not a kernel): a copy to or from another device type, a pin. A CPU run makes
    none; on a GPU each upload of a host tensor makes two or three (``wsss.utils.tensors.to_device``: ``is_pinned``,
    ``_pin_memory``, ``_to_copy``) and each read back one."""
    if func in _STAGING:
        return True
    if func is torch.ops.aten._to_copy.default:
        device = kwargs.get("device")
        return device is not None and torch.device(device).type != args[0].device.type
    if func is torch.ops.aten.copy_.default:
        return args[0].device.type != args[1].device.type
    return False


class OpCounter(TorchDispatchMode):
    """Counts the non-view ATen operations dispatched while active, per :meth:`stage` (``other`` outside any); the
    transfers between the host and a device apart (:func:`is_transfer`, :attr:`transfers`), so that a count made on a
    GPU compares with the CPU's."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()
        self.transfers: Counter[str] = Counter()
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
        kwargs = kwargs or {}
        if not self.paused and not is_view(func):
            (self.transfers if is_transfer(func, args, kwargs) else self.counts)[self.current] += 1
        return func(*args, **kwargs)

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
