"""wsss.utils.tensors: argmax is torch.argmax (the same indices on ties, the first; NaN, the NaN's; any dim);
fp32_precision sets both TF32 flags for its block and restores them."""

from __future__ import annotations

import pytest
import torch

from wsss.utils.tensors import argmax, fp32_precision


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_argmax_equals_torchs_with_ties_and_nans(dim):
    g = torch.Generator().manual_seed(dim + 5)
    x = torch.randint(0, 3, (5, 6, 7), generator=g).float()  # many ties
    x[2, 3, 4] = float("nan")
    x[4, 3, 4] = float("nan")  # two NaNs on one line of every dim through (2..4, 3, 4)
    torch.testing.assert_close(argmax(x, dim), x.argmax(dim), rtol=0, atol=0)
    assert (x.argmax(dim) > 0).any()  # not a trivial all-zero answer


def _tf32_flags() -> tuple[bool, bool]:
    return torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32


@pytest.mark.parametrize("start", [(False, True), (True, False)])  # torch's defaults, and the other way round
def test_fp32_precision_sets_both_flags_and_restores_them_on_an_error(start):
    before = _tf32_flags()
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = start
    try:
        for mode, inside in [("tf32", (True, True)), ("ieee", (False, False))]:
            with pytest.raises(KeyError), fp32_precision(mode):
                assert _tf32_flags() == inside
                raise KeyError("the block fails")
            assert _tf32_flags() == start
        with pytest.raises(ValueError, match="one of"), fp32_precision("highest"):
            pass
        assert _tf32_flags() == start
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
