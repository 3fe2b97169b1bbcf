"""bf16 autocast on the CPU: the training step (with ``train.amp`` and a bf16 CAM pass) and multi-scale inference
run under ``torch.autocast(dtype=torch.bfloat16)`` as they do on a GPU, so a dtype mismatch fails here first."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.conftest import tiny_config
from wsss.data.transforms import backbone_mean_std
from wsss.engine.optim import NonFiniteGuard, build_optimizer
from wsss.engine.schedule import PolyWarmupScheduler
from wsss.engine.step import TrainingStep
from wsss.engine.train import LossMeter, iteration, to_device
from wsss.models import build_model
from wsss.models.tta import tta_forward

pytestmark = pytest.mark.usefixtures("one_thread")


def setup(tmp_path):
    cfg = tiny_config(tmp_path)
    cfg = dataclasses.replace(
        cfg,
        loss=dataclasses.replace(cfg.loss, seg_start_iter=0),
        train=dataclasses.replace(cfg.train, amp=True, cam_dtype="bfloat16"),
    )
    torch.manual_seed(0)
    return cfg, build_model(cfg.model, num_classes=3)


def test_training_step_under_bf16_autocast(tmp_path, monkeypatch):
    cfg, model = setup(tmp_path)
    mean, std = backbone_mean_std(cfg.model.backbone)
    step = TrainingStep(cfg, mean, std, torch.device("cpu"))
    assert not step.amp  # amp is for CUDA; switch the step's own autocast on as a GPU would
    step.amp = step.cam_autocast = True
    bf16_matmuls = []
    linear = torch.nn.functional.linear

    def spy(x, weight, bias=None):
        out = linear(x, weight, bias)
        bf16_matmuls.append(out.dtype == torch.bfloat16)
        return out

    monkeypatch.setattr(torch.nn.functional, "linear", spy)
    optimizer = build_optimizer(model, cfg.optim)
    guard, meter = NonFiniteGuard(optimizer), LossMeter()
    scheduler = PolyWarmupScheduler(optimizer, 10, 2, 1e-6, 0.9)
    g = torch.Generator().manual_seed(1)
    batch = to_device(
        {
            "image": torch.randn(2, 3, 32, 32, generator=g),
            "label": torch.tensor([[1.0, 0.0], [0.0, 1.0]]),
            "box": torch.tensor([[0, 32, 0, 30], [2, 32, 0, 32]]),
        },
        torch.device("cpu"),
    )
    before = [p.detach().clone() for p in model.parameters()]
    for it in range(2):
        iteration(model, model, step, batch, it, optimizer, scheduler, guard, meter)
    guard.raise_if_tripped(None)
    assert bf16_matmuls and all(bf16_matmuls)  # the forward and the CAM pass ran in bf16
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    logged = meter.pop()
    assert set(logged) == {"cls", "aux", "seg", "reg", "loss"}
    assert all(torch.isfinite(torch.tensor(v)) for v in logged.values())


def test_multiscale_inference_under_bf16_autocast(tmp_path):
    _, model = setup(tmp_path)
    model.eval()
    images = torch.randn(2, 3, 40, 56)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = tta_forward(model, images, (1.0, 0.5, 1.5), flip=True, cams=True)
    ref = tta_forward(model, images, (1.0, 0.5, 1.5), flip=True, cams=True)
    for got, want in [(out.seg, ref.seg), (out.cls_logits, ref.cls_logits), (out.cam, ref.cam)]:
        assert got.dtype == torch.float32 and got.shape == want.shape
        scale = want.abs().max()
        assert (got - want).abs().max() <= 0.1 * scale  # bf16 keeps 8 bits: close, not equal
    assert not torch.equal(out.seg, ref.seg)  # ...and it did run in bf16
