"""wsss.utils.tensors.argmax is torch.argmax: the same indices on ties (the first), NaN (the NaN's) and any dim."""

from __future__ import annotations

import pytest
import torch

from wsss.utils.tensors import argmax


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_argmax_equals_torchs_with_ties_and_nans(dim):
    g = torch.Generator().manual_seed(dim + 5)
    x = torch.randint(0, 3, (5, 6, 7), generator=g).float()  # many ties
    x[2, 3, 4] = float("nan")
    x[4, 3, 4] = float("nan")  # two NaNs on one line of every dim through (2..4, 3, 4)
    torch.testing.assert_close(argmax(x, dim), x.argmax(dim), rtol=0, atol=0)
    assert (x.argmax(dim) > 0).any()  # not a trivial all-zero answer
