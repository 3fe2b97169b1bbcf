"""The peak memory of a call as the allocator counts it (wsss.utils.allocations)."""

from __future__ import annotations

import pytest
import torch

from wsss.utils.allocations import SkippedLaunches, peak_allocated


def test_the_peak_is_what_was_held_at_once_not_the_sum_of_what_was_made():
    """4 KB and 2 KB held together, then the 4 KB let go before 8 KB is made: the peak is 10 KB (not 14 KB, not
    8 KB); a tensor made before the call counts for nothing, and the result counts while it is held."""
    earlier = torch.ones(100_000)

    def run():
        a, b = torch.ones(1000), torch.ones(500)
        del a
        c = earlier[:2000].clone()  # an input read, not made
        return b, c

    assert peak_allocated(run) == 10_000
    assert peak_allocated(lambda: torch.ones(3, 1000, dtype=torch.float64)) == 24_000


def test_only_the_cpu_and_cuda_are_measured():
    with pytest.raises(ValueError, match="CPU or a CUDA device, not meta"):
        peak_allocated(lambda: None, "meta")


def test_a_skipped_kernel_launches_nothing():
    """The stand-in for a Triton kernel whose launches would only write into their outputs: none is written."""
    out = torch.zeros(4)
    assert SkippedLaunches()[(1,)](out, 1.0, BLOCK=4) is None
    assert torch.equal(out, torch.zeros(4))
