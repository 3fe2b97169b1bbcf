"""The fused Triton energy kernel against the blocked version and brute-force N x N references.

Without a GPU the kernel runs in Triton's CPU interpreter (``TRITON_INTERPRET=1``, set in ``conftest.py``), which
is slow: sizes stay at a few hundred points. The interpreter multiplies in IEEE float32; the kernel's product operands
are TF32 values, so it forms the same partial products as the tensor cores (the accumulation order differs).
"""

import pytest
import torch

from tests.test_losses import brute_kernel, reference_toco_loss, smooth_image
from wsss.losses import DenseEnergyLoss, gaussian_filter, gaussian_filter_dense

triton = pytest.importorskip("triton")

from tests.triton_interpreter import needs_kernel  # noqa: E402
from wsss import energy_kernel  # noqa: E402  (after the skip: needs triton)

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def max_relative_error(x, ref):
    """``max |x - ref| / max |ref|`` in float64."""
    return ((x.double().cpu() - ref.double().cpu()).abs().max() / ref.double().abs().max()).item()


@needs_kernel
@pytest.mark.parametrize(
    "n, k, offset, blocks",
    [
        (300, 21, 3.0, {}),  # default 128 x 64 blocks: row and column tails, K padded to 32
        (100, 4, 500.0, {"block_rows": 32, "block_cols": 16}),  # many tiles, K padded to 16, large common offset
    ],
)
def test_fused_filter_matches_blocked_and_brute_force(n, k, offset, blocks):
    torch.manual_seed(0)
    f = torch.randn(n, 5) * torch.tensor([0.5, 0.5, 2.0, 2.0, 2.0]) + offset
    v = torch.rand(n, k)
    ref = brute_kernel(f) @ v.double()
    fused = energy_kernel.gaussian_filter_fused(f.to(DEVICE), v.to(DEVICE), **blocks)
    blocked = gaussian_filter_dense(f, v, block_size=64)
    assert fused.shape == (n, k) and fused.dtype == torch.float32
    torch.testing.assert_close(fused.double().cpu(), ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fused.cpu(), blocked, rtol=1e-5, atol=1e-6)


def test_split_tf32_halves_are_tf32_and_sum_to_x():
    torch.manual_seed(0)
    x = torch.randn(10_000) * torch.logspace(-20, 20, 10_000)
    hi, lo = energy_kernel.split_tf32(x)
    tf32_dropped_bits = 0x1FFF  # the 13 low mantissa bits of float32 that TF32 does not have
    for half in (hi, lo):
        assert ((half.view(torch.int32) & tf32_dropped_bits) == 0).all()
    x64 = x.double()
    assert ((x64 - hi.double()).abs() <= 2**-11 * x64.abs()).all()
    assert ((x64 - hi.double() - lo.double()).abs() <= 2**-22 * x64.abs()).all()


@needs_kernel
def test_dispatch():
    torch.manual_seed(0)
    f, v = torch.randn(40, 5).to(DEVICE), torch.rand(40, 3).to(DEVICE)
    fused = energy_kernel.gaussian_filter_fused(f, v)
    expected = fused if DEVICE.type == "cuda" else gaussian_filter_dense(f, v)
    assert torch.equal(gaussian_filter(f, v, "auto", None), expected)
    assert torch.equal(gaussian_filter(f, v, "fused", None), fused)
    assert torch.equal(gaussian_filter(f, v, "blocked", block_size=16), gaussian_filter_dense(f, v, 16))
    with pytest.raises(ValueError, match="valid: auto, fused, blocked"):
        gaussian_filter(f, v, "lattice", None)


@needs_kernel
def test_fused_energy_loss_matches_blocked_and_brute_force(monkeypatch):
    # Valid box, ignored pseudo labels (gate 1), a non-uniform gate elsewhere, 21 classes; 192 points per image
    # at scale 0.5 (15 x 11 = 165 inside image 0's box, the rest masked): tails of both block edges.
    torch.manual_seed(3)
    b, c, h, w = 2, 21, 32, 24
    images = smooth_image(b, h, w, seed=3)
    logits = 3 * torch.randn(b, c, h, w)
    valid = torch.zeros(b, h, w, dtype=torch.bool)
    valid[0, 2:31, 0:22] = True
    valid[1] = True
    label = torch.randint(0, c, (b, h, w))
    label[torch.rand(b, h, w) > 0.6] = 255
    constants = {"weight": 1e-3, "sigma_rgb": 15.0, "sigma_xy": 10.0, "scale_factor": 0.5, "ignore_index": 255}

    fused, fused_calls = energy_kernel.gaussian_filter_fused, []

    def spy(features, values):
        fused_calls.append(features.shape[0])
        return fused(features, values)

    monkeypatch.setattr(energy_kernel, "gaussian_filter_fused", spy)
    results = {}
    for kernel, device in [("fused", DEVICE), ("blocked", torch.device("cpu"))]:
        x = logits.to(device).requires_grad_(True)
        loss_fn = DenseEnergyLoss(**constants, kernel=kernel, block_size=40)
        loss = loss_fn(images.to(device), x.softmax(1), valid.to(device), label.to(device))
        (grad,) = torch.autograd.grad(loss, x)
        results[kernel] = (loss.cpu(), grad.cpu())
    x = logits.clone().requires_grad_(True)
    ref, surrogate = reference_toco_loss(images, x.softmax(1), valid, label, 1e-3, 15.0, 10.0, 0.5)
    (grad_ref,) = torch.autograd.grad(surrogate, x)

    assert fused_calls == [192, 192]  # every pixel of each image (masked outside the roi), through the fused kernel
    fused_loss, fused_grad = results["fused"]
    gate = 1 - logits.softmax(1).amax(1)
    assert gate.std() > 0.05 and ref.item() < 0
    for other_loss, other_grad in [(ref, grad_ref), results["blocked"]]:
        torch.testing.assert_close(fused_loss.double(), other_loss.double(), rtol=1e-5, atol=0)
        atol = 1e-5 * other_grad.abs().max().item()
        torch.testing.assert_close(fused_grad.double(), other_grad.double(), rtol=1e-4, atol=atol)
        assert max_relative_error(fused_grad, other_grad) < 1e-4
