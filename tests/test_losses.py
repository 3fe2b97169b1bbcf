import math

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import record_at_calls, tf32_flags
from wsss import losses
from wsss.losses import (
    DenseEnergyLoss,
    balanced_seg_ce,
    bilateral_features,
    dense_energy,
    gaussian_filter_dense,
    kernel_exponent_factors,
    multilabel_soft_margin,
)
from wsss.utils.tensors import fp32_precision


def test_multilabel_soft_margin_hand_computed_and_torch():
    # -log sigmoid(0) = ln 2; -log sigmoid(-ln 3) = ln 4; mean = 1.5 ln 2.
    logits = torch.tensor([[0.0, math.log(3.0)]])
    labels = torch.tensor([[1.0, 0.0]])
    torch.testing.assert_close(multilabel_soft_margin(logits, labels), torch.tensor(1.5 * math.log(2.0)))
    torch.manual_seed(0)
    logits = torch.randn(4, 20) * 5
    labels = (torch.rand(4, 20) > 0.7).float()
    torch.testing.assert_close(multilabel_soft_margin(logits, labels), F.multilabel_soft_margin_loss(logits, labels))


def _ce(logits, target):
    return math.log(sum(math.exp(v) for v in logits)) - logits[target]


def test_balanced_seg_ce_hand_computed():
    # 3 classes, 4 pixels: bg, bg, fg(2), ignore.
    pix = [[2.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 3.0], [5.0, 0.0, 0.0]]
    logits = torch.tensor(pix).T.reshape(1, 3, 1, 4)
    label = torch.tensor([[[0, 0, 2, 255]]])
    bg = (_ce(pix[0], 0) + _ce(pix[1], 0)) / 2
    fg = _ce(pix[2], 2)
    torch.testing.assert_close(balanced_seg_ce(logits, label, 255), torch.tensor(0.5 * bg + 0.5 * fg))


def test_balanced_seg_ce_missing_parts_are_finite():
    logits = torch.randn(2, 3, 4, 4, requires_grad=True)
    only_bg = torch.zeros(2, 4, 4, dtype=torch.long)
    ce = F.cross_entropy(logits, only_bg)
    torch.testing.assert_close(balanced_seg_ce(logits, only_bg, 255), 0.5 * ce)
    only_fg = torch.ones(2, 4, 4, dtype=torch.long)
    torch.testing.assert_close(balanced_seg_ce(logits, only_fg, 255), 0.5 * F.cross_entropy(logits, only_fg))
    ignored = torch.full((2, 4, 4), 255)
    loss = balanced_seg_ce(logits, ignored, 255)
    loss.backward()
    assert loss.item() == 0.0 and torch.isfinite(logits.grad).all()


def test_balanced_seg_ce_upsamples_logits():
    torch.manual_seed(0)
    logits = torch.randn(1, 3, 4, 4)
    label = torch.randint(0, 3, (1, 8, 8))
    up = F.interpolate(logits, size=(8, 8), mode="bilinear", align_corners=False)
    torch.testing.assert_close(balanced_seg_ce(logits, label, 255), balanced_seg_ce(up, label, 255))


def brute_kernel(features):
    """Dense N x N Gaussian kernel in float64, from explicit feature differences."""
    diff = features.double()[:, None, :] - features.double()[None, :, :]
    return torch.exp(-0.5 * (diff**2).sum(-1))


@pytest.mark.parametrize("block_size", [7, 64, None])
def test_gaussian_filter_dense_matches_brute_force(block_size):
    torch.manual_seed(0)
    f = torch.randn(45, 5) * torch.tensor([0.5, 0.5, 2.0, 2.0, 2.0]) + 3.0
    v = torch.rand(45, 4)
    out = gaussian_filter_dense(f, v, block_size)
    torch.testing.assert_close(out.double(), brute_kernel(f) @ v.double(), rtol=1e-5, atol=1e-6)


def _round_tf32(x):
    """Round float32 to TF32 (10 explicit mantissa bits), as a TF32 matmul does with its inputs."""
    bits = (x.contiguous().view(torch.int32) + 0x1000) & ~0x1FFF
    return bits.view(torch.float32)


def test_the_exact_kernel_computes_ieee_products_in_a_tf32_run(monkeypatch):
    """``train.fp32_precision="tf32"`` (the default) holds around the energy loss, yet the exact kernel's products run
    in IEEE float32 (what a GPU's cuBLAS reads; the CPU ignores it), and the run's setting comes back after it."""
    seen = record_at_calls(monkeypatch, losses, "kernel_exponent_factors")
    with fp32_precision("tf32"):
        gaussian_filter_dense(torch.randn(50, 5), torch.randn(50, 3), block_size=16)
        assert seen == [(False, False)] and tf32_flags() == (True, True)


def test_kernel_exponents_survive_reduced_precision_matmul():
    torch.manual_seed(0)
    feats = bilateral_features(torch.rand(1, 3, 40, 40) * 255, sigma_rgb=15.0, sigma_xy=50.0)[0].flatten(1).T
    exact = -0.5 * torch.cdist(feats.double(), feats.double()) ** 2
    left, right_t = kernel_exponent_factors(feats)
    assert left.dtype == right_t.dtype == torch.float32
    for rounding, bound in [(lambda x: x, 1e-4), (_round_tf32, 1e-3), (lambda x: x.bfloat16().float(), 1e-2)]:
        product = rounding(left).double() @ rounding(right_t).double()
        assert (product - exact).abs().max() < bound
    # Without the split, TF32 rounding of the same factors is off by > 0.1 in the exponent.
    centred = feats.double() - feats.double().mean(0)
    half_sq = -0.5 * (centred**2).sum(1, keepdim=True)
    a = torch.cat([centred, half_sq, torch.ones_like(half_sq)], 1).float()
    b = torch.cat([centred, torch.ones_like(half_sq), half_sq], 1).float()
    assert (_round_tf32(a).double() @ _round_tf32(b).T.double() - exact).abs().max() > 0.1


def smooth_image(b, h, w, seed=0):
    """0..255 images with smooth colour variation, so that the colour kernel is not all ~0."""
    g = torch.Generator().manual_seed(seed)
    coarse = torch.rand(b, 3, 3, 3, generator=g) * 255
    return F.interpolate(coarse, size=(h, w), mode="bilinear", align_corners=False)


def brute_energy(probs, features, roi, gate):
    """-(1/B) sum_b sum_k (g S_k)^T W S_k, dense over the roi pixels, plus ToCo's gradient surrogate."""
    b, k = probs.shape[:2]
    energy, surrogate = 0, 0
    for i in range(b):
        idx = roi[i].reshape(-1).nonzero().squeeze(1)
        s = probs[i].reshape(k, -1)[:, idx].T.double()
        w = brute_kernel(features[i].reshape(features.shape[1], -1)[:, idx].T)
        g = gate[i].reshape(-1)[idx].double()[:, None]
        energy = energy - (g * s * (w @ s)).sum()
        surrogate = surrogate - 2 * (g * s * (w @ s.detach())).sum()
    return energy / b, surrogate / b


def test_dense_energy_ungated_value_and_gradient():
    torch.manual_seed(0)
    images = smooth_image(2, 16, 12)
    feats = bilateral_features(images, sigma_rgb=15.0, sigma_xy=8.0)
    logits = torch.randn(2, 3, 16, 12, requires_grad=True)
    probs = logits.softmax(1)
    energy = dense_energy(probs, feats, "blocked", block_size=50)
    (grad,) = torch.autograd.grad(energy, logits)

    logits_ref = logits.detach().clone().requires_grad_(True)
    ones = torch.ones(2, 16, 12)
    ref, _ = brute_energy(logits_ref.softmax(1), feats, ones.bool(), ones)
    (grad_ref,) = torch.autograd.grad(ref, logits_ref)
    torch.testing.assert_close(energy.double(), ref, rtol=1e-5, atol=0)
    torch.testing.assert_close(grad.double(), grad_ref.double(), rtol=1e-4, atol=1e-5 * grad_ref.abs().max().item())


def test_dense_energy_gated_roi_value_and_toco_gradient():
    torch.manual_seed(1)
    images = smooth_image(2, 16, 12, seed=1)
    feats = bilateral_features(images, sigma_rgb=15.0, sigma_xy=8.0)
    probs = torch.rand(2, 3, 16, 12).softmax(1).requires_grad_(True)
    roi = torch.ones(2, 16, 12, dtype=torch.bool)
    roi[0, :, 9:] = False
    roi[1, 12:] = False
    gate = torch.rand(2, 16, 12) * roi
    energy = dense_energy(probs, feats, "blocked", roi, gate, block_size=33)
    (grad,) = torch.autograd.grad(energy, probs)

    probs_ref = probs.detach().clone().requires_grad_(True)
    ref, surrogate = brute_energy(probs_ref, feats, roi, gate)
    (grad_ref,) = torch.autograd.grad(surrogate, probs_ref)
    torch.testing.assert_close(energy.double(), ref, rtol=1e-5, atol=0)
    torch.testing.assert_close(grad.double(), grad_ref.double(), rtol=1e-4, atol=1e-5 * grad_ref.abs().max().item())
    assert (grad[0, :, :, 9:] == 0).all() and (grad[1, :, 12:] == 0).all()


def reference_toco_loss(images, probs, valid, label, weight, sigma_rgb, sigma_xy, scale):
    """ToCo's DenseEnergyLoss pipeline written out, with a dense N x N kernel."""
    h, w = probs.shape[-2:]
    size = (int(h * scale), int(w * scale))
    img = F.interpolate(images, size=size, mode="nearest")
    s = F.interpolate(probs, size=size, mode="bilinear", align_corners=False)
    roi = F.interpolate(valid[:, None].float(), size=size, mode="nearest")[:, 0]
    unlabelled = F.interpolate(label[:, None].float(), size=size, mode="nearest")[:, 0] == 255
    gate = roi - s.detach().max(dim=1)[0]
    gate[unlabelled] = 1
    gate[gate < 0] = 0
    ys, xs = torch.meshgrid(torch.arange(size[0]), torch.arange(size[1]), indexing="ij")
    sxy = sigma_xy * scale
    feats = torch.cat([torch.stack([xs / sxy, ys / sxy])[None].expand(len(img), 2, *size), img / sigma_rgb], 1)
    energy, surrogate = brute_energy(s * roi[:, None], feats, torch.ones_like(roi).bool(), gate)
    return weight * energy, weight * surrogate


@pytest.mark.parametrize("sigma_xy", [100.0, 10.0])
def test_dense_energy_loss_matches_toco_pipeline(sigma_xy):
    torch.manual_seed(2)
    b, c, h, w = 2, 4, 32, 24
    images = smooth_image(b, h, w, seed=2)
    logits = torch.randn(b, c, h, w, requires_grad=True)
    valid = torch.zeros(b, h, w, dtype=torch.bool)
    valid[0, 2:30, 0:20] = True
    valid[1] = True
    label = torch.randint(0, c, (b, h, w))
    label[torch.rand(b, h, w) > 0.6] = 255
    loss_fn = DenseEnergyLoss(
        weight=1e-3, sigma_rgb=15.0, sigma_xy=sigma_xy, scale_factor=0.5, ignore_index=255, kernel="blocked",
        block_size=40,
    )
    loss = loss_fn(images, logits.softmax(1), valid, label)
    (grad,) = torch.autograd.grad(loss, logits)

    logits_ref = logits.detach().clone().requires_grad_(True)
    ref, surrogate = reference_toco_loss(images, logits_ref.softmax(1), valid, label, 1e-3, 15.0, sigma_xy, 0.5)
    (grad_ref,) = torch.autograd.grad(surrogate, logits_ref)
    assert loss.item() < 0
    torch.testing.assert_close(loss.double(), ref, rtol=1e-5, atol=0)
    torch.testing.assert_close(grad.double(), grad_ref.double(), rtol=1e-4, atol=1e-5 * grad_ref.abs().max().item())


def test_dense_energy_prefers_piecewise_constant_segmentation():
    # Two colour regions: labelling them consistently has lower energy than a noisy labelling.
    images = torch.zeros(1, 3, 16, 16)
    images[..., 8:] = 200.0
    consistent = torch.zeros(1, 2, 16, 16)
    consistent[:, 0, :, :8] = 1
    consistent[:, 1, :, 8:] = 1
    noisy = consistent.clone()
    noisy[:, :, ::2] = noisy[:, :, ::2].flip(1)
    feats = bilateral_features(images, 15.0, 50.0)
    assert dense_energy(consistent, feats, "blocked") < dense_energy(noisy, feats, "blocked")
