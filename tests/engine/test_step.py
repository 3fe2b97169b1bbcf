"""The training step: every term against an independent computation with the reference's constants."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import tiny_config
from wsss.cam import multiscale_cam
from wsss.config import LossConfig
from wsss.data.transforms import backbone_mean_std, denormalize
from wsss.engine.step import TrainingStep, loss_weights
from wsss.losses import DenseEnergyLoss, balanced_seg_ce
from wsss.models import PixelResize, build_model
from wsss.par import PAR
from wsss.pseudo_label import boxes_to_mask, pseudo_labels

pytestmark = pytest.mark.usefixtures("one_thread")

CROP = 32


@pytest.fixture
def setup(tmp_path):
    """A tiny model (no stochastic depth, so two forward passes agree), its config with the default loss
    settings, and a batch whose crops hold image pixels only inside partial valid boxes."""
    cfg = tiny_config(tmp_path)
    cfg = dataclasses.replace(
        cfg, loss=LossConfig(), model=dataclasses.replace(cfg.model, drop_path_rate=0.0)
    )  # fmt: skip
    torch.manual_seed(0)
    model = build_model(cfg.model, num_classes=3).train()
    g = torch.Generator().manual_seed(1)
    batch = {
        "image": torch.randn(2, 3, CROP, CROP, generator=g),
        "label": torch.tensor([[1.0, 0.0], [1.0, 1.0]]),
        "box": torch.tensor([[3, 30, 0, 32], [0, 32, 5, 26]]),
    }
    mean, std = backbone_mean_std(cfg.model.backbone)
    return cfg, model, batch, mean, std


def test_dense_losses_switch_on_where_the_reference_does():
    """ToCo keeps the seg and reg weights at 0 while ``n_iter <= 2000`` (0-based)."""
    weights = [loss_weights(it, LossConfig()) for it in (0, 2000, 2001, 79999)]
    assert [w["seg"] for w in weights] == [0.0, 0.0, 0.1, 0.1]
    assert [w["reg"] for w in weights] == [0.0, 0.0, 0.05, 0.05]
    assert all(w["cls"] == 1.0 and w["aux"] == 1.0 for w in weights)


def test_step_terms_match_an_independent_computation(setup):
    cfg, model, batch, mean, std = setup
    step = TrainingStep(cfg, mean, std, torch.device("cpu"))
    loss, terms = step(model, model, batch, it=2001)
    assert set(terms) == {"cls", "aux", "seg", "reg"}

    images, labels, boxes = batch["image"], batch["label"], batch["box"]
    with torch.no_grad():
        out = model(images)
        cams = multiscale_cam(model.cam, images, labels, cfg.cam.scales)  # the final classifier's CAM
    rgb = denormalize(images, mean, std)
    valid = boxes_to_mask(boxes, CROP, CROP)
    par = PAR.from_config(cfg.par)
    target = pseudo_labels(rgb, cams, labels, valid, par, 0.7, 0.25, cfg.par.scale, 255)
    seg = F.interpolate(out.seg, size=(CROP, CROP), mode="bilinear", align_corners=False)
    energy = DenseEnergyLoss(1e-7, 15.0, 100.0, cfg.loss.reg_scale, 255, "lattice")  # ToCo's, at its weight
    expected = {
        "cls": F.multilabel_soft_margin_loss(out.logits, labels),
        "aux": F.multilabel_soft_margin_loss(out.aux_logits, labels),
        "seg": balanced_seg_ce(seg, target, 255),
        "reg": energy(rgb * 255.0, seg.softmax(dim=1), valid, target),
    }
    for k, v in expected.items():
        torch.testing.assert_close(terms[k].detach(), v.detach(), rtol=1e-5, atol=1e-7, msg=k)
    total = expected["cls"] + expected["aux"] + 0.1 * expected["seg"] + 0.05 * expected["reg"]
    torch.testing.assert_close(loss.detach(), total.detach(), rtol=1e-5, atol=1e-7)

    # The batch tells the planted mistakes apart, so the comparisons above can fail:
    with torch.no_grad():
        aux_cams = multiscale_cam(lambda x: model.cam(x, aux=True), images, labels, cfg.cam.scales)
    wrong_targets = {
        "aux CAM": pseudo_labels(rgb, aux_cams, labels, valid, par, 0.7, 0.25, cfg.par.scale, 255),
        "swapped thresholds": pseudo_labels(rgb, cams, labels, valid, par, 0.25, 0.7, cfg.par.scale, 255),
        "no valid box": pseudo_labels(rgb, cams, labels, None, par, 0.7, 0.25, cfg.par.scale, 255),
    }
    for name, wrong in wrong_targets.items():
        assert not torch.equal(wrong, target), name
        assert not torch.allclose(balanced_seg_ce(seg, wrong, 255), expected["seg"]), name
    exact = DenseEnergyLoss(1e-7 * cfg.loss.reg_lattice_match, 15.0, 100.0, cfg.loss.reg_scale, 255, "blocked")
    for wrong_energy in (
        energy(rgb, seg.softmax(dim=1), valid, target),  # a [0, 1] image
        energy(rgb * 255.0, seg.softmax(dim=1), None, target),  # the valid box dropped
        exact(rgb * 255.0, seg.softmax(dim=1), valid, target),  # the exact kernel (the default before 2026-11-28)
    ):
        assert not torch.allclose(wrong_energy, expected["reg"], rtol=1e-3)
    assert {0, 255} <= set(target.unique().tolist()) and (target > 0).logical_and(target < 255).any()


def test_the_logits_resize_switch_changes_rounding_only(setup):
    """``loss.seg_resize``: ``matmul`` (the default) and ``interpolate`` (the reference's call) give the same terms
    and gradients in float32 rounding, each through its own resize."""
    cfg, model, batch, mean, std = setup
    results = {}
    for method in ("matmul", "interpolate"):
        resized = dataclasses.replace(cfg, loss=LossConfig(seg_resize=method))
        step = TrainingStep(resized, mean, std, torch.device("cpu"))
        assert isinstance(step.to_pixels, PixelResize) == (method == "matmul")
        model.zero_grad()
        loss, terms = step(model, model, batch, it=2001)
        loss.backward()
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        results[method] = {k: v.detach() for k, v in terms.items()}, grads
    (terms_a, grads_a), (terms_b, grads_b) = results.values()
    for k in terms_a:
        torch.testing.assert_close(terms_a[k], terms_b[k], rtol=1e-5, atol=1e-7, msg=k)
    for a, b in zip(grads_a, grads_b, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert model.decoder.cls.weight.grad.abs().sum() > 0


def test_step_before_the_switch_has_only_classification(setup):
    cfg, model, batch, mean, std = setup
    step = TrainingStep(cfg, mean, std, torch.device("cpu"))
    loss, terms = step(model, model, batch, it=2000)
    assert set(terms) == {"cls", "aux"}
    torch.testing.assert_close(loss, terms["cls"] + terms["aux"])
    loss.backward()  # the decoder stays in the graph (DDP needs a gradient for every parameter)
    assert model.decoder.cls.weight.grad is not None and not model.decoder.cls.weight.grad.any()


def test_cam_pass_builds_no_graph(setup):
    cfg, model, batch, mean, std = setup
    targets = TrainingStep(cfg, mean, std, torch.device("cpu")).targets(model, batch)
    for t in (targets.cams, targets.label, targets.rgb):
        assert not t.requires_grad and t.grad_fn is None
    assert targets.label.shape == (2, CROP, CROP) and targets.cams.shape == (2, 2, CROP, CROP)
    # outside the valid box every pseudo label is ignored
    assert (targets.label[~targets.valid] == 255).all() and (~targets.valid).any()
