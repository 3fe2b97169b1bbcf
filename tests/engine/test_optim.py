"""The update without host synchronisation: the fused AdamW's device-side skip, and a whole iteration that never
waits for the device."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tests.conftest import tiny_config
from wsss.config import OptimConfig
from wsss.data.transforms import backbone_mean_std
from wsss.engine.optim import NonFiniteGuard, NonFiniteLossError, build_optimizer
from wsss.engine.schedule import PolyWarmupScheduler
from wsss.engine.step import TrainingStep
from wsss.engine.train import LossMeter, iteration, to_device, train
from wsss.model_file import load_checkpoint
from wsss.models import build_model

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_model():
    cfg = tiny_config(".")
    torch.manual_seed(0)
    return cfg, build_model(cfg.model, num_classes=3)


def test_guard_skips_every_update_from_the_first_non_finite_gradient():
    _, model = tiny_model()
    optimizer = build_optimizer(model, OptimConfig(lr=1e-2))
    guard = NonFiniteGuard(optimizer)
    params = [p for g in optimizer.param_groups for p in g["params"]]

    def step(it: int, poison: bool) -> None:
        optimizer.zero_grad(set_to_none=True)
        loss = sum(p.sum() for p in params)  # finite: only a gradient is poisoned
        loss.backward()
        if poison:
            params[3].grad[0] = float("inf")
        guard.update(loss, it)
        optimizer.step()

    start = [p.detach().clone() for p in params]
    step(0, poison=False)
    after_good = [p.detach().clone() for p in params]
    assert not any(torch.equal(a, b) for a, b in zip(start, after_good, strict=True))  # a good step updates
    moments = [optimizer.state[p]["exp_avg"].clone() for p in params]
    guard.raise_if_tripped("iter_0.pth")  # nothing to report yet

    step(1, poison=True)
    step(2, poison=False)  # a good step after a bad one is skipped too: the run stops at the last good weights
    assert all(torch.equal(a, p) for a, p in zip(after_good, params, strict=True))
    assert all(torch.equal(m, optimizer.state[p]["exp_avg"]) for m, p in zip(moments, params, strict=True))
    assert all(optimizer.state[p]["step"].item() == 1 for p in params)
    with pytest.raises(NonFiniteLossError, match="non-finite loss or gradient at iteration 1; .* iter_0.pth"):
        guard.raise_if_tripped("iter_0.pth")


def test_guard_trips_on_a_non_finite_loss():
    _, model = tiny_model()
    guard = NonFiniteGuard(build_optimizer(model, OptimConfig()))
    guard.update(torch.tensor(float("nan")), 7)
    with pytest.raises(NonFiniteLossError, match="iteration 7"):
        guard.raise_if_tripped(None)


SYNC_OPS = {"aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select", "aten::_unique2", "aten::item"}
"""Operators whose result (a Python number or a data-dependent shape) makes the host wait for a GPU."""


class SyncCounter(TorchDispatchMode):
    """Records every operator of :data:`SYNC_OPS` dispatched while active (also inside autograd's backward)."""

    def __init__(self):
        super().__init__()
        self.calls: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func._schema.name in SYNC_OPS:
            self.calls.append(func._schema.name)
        return func(*args, **(kwargs or {}))


def test_iterations_never_wait_for_the_device(tmp_path, monkeypatch):
    """Three iterations with every loss term on (CAM pass, PAR pseudo labels, energy loss, guard, fused AdamW):
    no operator that reads the device back, and no ``.cpu()``, ``.numpy()``, ``.tolist()`` or ``.item()``."""
    cfg = tiny_config(tmp_path)
    # the exact energy: the lattice reads its codes back on the CPU, where a GPU fixes them in advance (the build
    # without a host read on the emulated device: tests/test_energy_lattice.py)
    cfg = dataclasses.replace(cfg, loss=dataclasses.replace(cfg.loss, seg_start_iter=0, reg_kernel="blocked"))
    torch.manual_seed(0)
    model = build_model(cfg.model, num_classes=3).train()
    optimizer = build_optimizer(model, cfg.optim)
    scheduler = PolyWarmupScheduler(optimizer, 10, 2, 1e-6, 0.9)
    guard, meter = NonFiniteGuard(optimizer), LossMeter()
    mean, std = backbone_mean_std(cfg.model.backbone)
    step = TrainingStep(cfg, mean, std, torch.device("cpu"))
    g = torch.Generator().manual_seed(1)
    host = {
        "image": torch.randn(2, 3, 32, 32, generator=g),
        "label": torch.tensor([[1.0, 0.0], [1.0, 1.0]]),
        "box": torch.tensor([[3, 30, 0, 32], [0, 32, 5, 26]]),
    }
    batch = to_device(host, torch.device("cpu"))
    assert batch["max_present"] == 2
    host_reads = []
    for name in ("cpu", "numpy", "tolist", "item"):
        original = getattr(torch.Tensor, name)

        def spy(self, *args, _name=name, _original=original, **kwargs):
            host_reads.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, spy)
    before = [p.detach().clone() for p in model.parameters()]
    with SyncCounter() as counter:
        for it in range(3):
            iteration(model, model, step, batch, it, optimizer, scheduler, guard, meter)
    monkeypatch.undo()
    assert counter.calls == [] and host_reads == []
    assert set(meter.sums) == {"cls", "aux", "seg", "reg", "loss"}  # the dense terms did run
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))

    # the same iterations without the host's class count read it from the device (the counter can fail)
    del batch["max_present"]
    with SyncCounter() as counter:
        iteration(model, model, step, batch, 3, optimizer, scheduler, guard, meter)
    assert counter.calls == ["aten::_local_scalar_dense"]


def test_a_diverging_run_stops_with_finite_weights(tiny_voc, tmp_path):
    """``optim.lr=1e6``: the weights blow up and gradients turn non-finite; the guard skips those updates, so the
    run stops on the guard, not on the checkpoint's refusal to save non-finite weights, and what was saved is
    finite."""
    cfg = tiny_config(tiny_voc, max_iters=6)
    cfg.optim.lr = 1e6
    with pytest.raises(NonFiniteLossError, match="non-finite loss or gradient at iteration"):
        train(cfg, work_dir=tmp_path / "w", device="cpu")
    for path in sorted((tmp_path / "w").glob("iter_*.pth")):
        assert all(torch.isfinite(v).all() for v in load_checkpoint(path)["model"].values() if v.is_floating_point())
