"""A non-finite optimiser state is treated like a non-finite loss: the run stops, nothing with it is saved, and the
checkpoint named as the last good one holds only finite tensors (weights and AdamW moments)."""

from __future__ import annotations

import hashlib
import io

import pytest
import torch

from tests.conftest import tiny_config
from wsss.config import OptimConfig
from wsss.engine.checkpoint import (
    LAST_CHECKPOINT,
    NonFiniteWeightsError,
    load_resume_checkpoint,
    save_checkpoint,
)
from wsss.engine.optim import NonFiniteGuard, NonFiniteLossError, build_optimizer
from wsss.engine.resume import find_checkpoint
from wsss.engine.step import TrainingStep
from wsss.engine.train import train
from wsss.model_file import checksum_path
from wsss.models import build_model

pytestmark = pytest.mark.usefixtures("one_thread")

HUGE = 1e25
"""A loss scale whose gradients stay finite (below 3.4e38) while their squares, AdamW's second moment, overflow."""


def non_finite(ckpt: dict) -> list[str]:
    """Names of the floating-point tensors of a checkpoint's weights and optimiser state holding a NaN or inf."""
    tensors = {f"model.{k}": v for k, v in ckpt["model"].items()}
    for index, state in ckpt.get("optimizer", {}).get("state", {}).items():
        tensors.update({f"optimizer.{index}.{k}": v for k, v in state.items() if torch.is_tensor(v)})
    return [k for k, v in tensors.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]


def tiny_optimizer():
    cfg = tiny_config(".")
    torch.manual_seed(0)
    model = build_model(cfg.model, num_classes=3)
    return cfg, model, build_optimizer(model, OptimConfig(lr=1e-2))


def step(model, optimizer, guard, it: int, scale: float) -> None:
    params = [p for g in optimizer.param_groups for p in g["params"]]
    optimizer.zero_grad(set_to_none=True)
    loss = sum((p * p).sum() for p in params) * scale
    loss.backward()
    guard.update(loss, it)
    optimizer.step()


def test_an_overflowing_moment_trips_the_guard_and_skips_later_updates():
    _, model, optimizer = tiny_optimizer()
    guard = NonFiniteGuard(optimizer)
    step(model, optimizer, guard, 0, 1.0)
    guard.raise_if_tripped("iter_1.pth")
    step(model, optimizer, guard, 1, HUGE)  # finite loss and gradients; exp_avg_sq overflows to inf
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert all(bool(torch.isfinite(g).all()) for g in grads)
    assert any(not bool(torch.isfinite(s["exp_avg_sq"]).all()) for s in optimizer.state.values())
    after = [p.detach().clone() for p in model.parameters()]
    step(model, optimizer, guard, 2, 1.0)  # skipped, as after a non-finite loss
    assert all(torch.equal(a, p) for a, p in zip(after, model.parameters(), strict=True))
    with pytest.raises(
        NonFiniteLossError, match=r"non-finite optimiser state .*iteration 1.*Last good checkpoint: iter_1"
    ):
        guard.raise_if_tripped("iter_1.pth")


def test_a_non_finite_optimiser_state_is_never_saved(tmp_path):
    cfg, model, optimizer = tiny_optimizer()
    guard = NonFiniteGuard(optimizer)
    step(model, optimizer, guard, 0, HUGE)
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters())  # the weights alone look fine
    with pytest.raises(NonFiniteWeightsError, match=r"iter_1.pth.*optimiser state"):
        save_checkpoint(tmp_path / "iter_1.pth", model, cfg, ["bg", "a", "b"], (0.5,) * 3, (0.2,) * 3, 1, optimizer)
    assert list(tmp_path.iterdir()) == []


def test_training_names_only_a_finite_checkpoint_as_last_good(tiny_voc, tmp_path, monkeypatch):
    real_call = TrainingStep.__call__

    def overflow_at_3(self, model, raw_model, batch, it):
        loss, terms = real_call(self, model, raw_model, batch, it)
        return (loss * HUGE if it == 3 else loss), terms

    monkeypatch.setattr(TrainingStep, "__call__", overflow_at_3)
    work = tmp_path / "w"
    with pytest.raises(NonFiniteLossError, match=r"iteration 3.*Last good checkpoint: .*iter_3.pth"):
        train(tiny_config(tiny_voc, max_iters=6, ckpt_interval=1), work_dir=work, device="cpu")
    assert sorted(p.name for p in work.glob("iter_*.pth")) == ["iter_1.pth", "iter_2.pth", "iter_3.pth"]
    assert (work / LAST_CHECKPOINT).read_text().strip() == "iter_3.pth"
    for path in work.glob("iter_*.pth"):
        assert non_finite(torch.load(path, weights_only=True)) == [], path


def test_resume_skips_a_checkpoint_with_non_finite_moments(tmp_path, capsys):
    """A checkpoint written before this check (its moments inf) is not resumed from; the previous one is."""
    cfg, model, optimizer = tiny_optimizer()
    guard = NonFiniteGuard(optimizer)
    work = tmp_path / "w"
    step(model, optimizer, guard, 0, 1.0)
    save_checkpoint(work / "iter_1.pth", model, cfg, ["bg", "a", "b"], (0.5,) * 3, (0.2,) * 3, 1, optimizer)
    ckpt = torch.load(work / "iter_1.pth", weights_only=True)
    ckpt["step"] = 2
    next(iter(ckpt["optimizer"]["state"].values()))["exp_avg_sq"][0] = float("inf")
    buf = io.BytesIO()
    torch.save(ckpt, buf)
    (work / "iter_2.pth").write_bytes(buf.getvalue())
    checksum_path(work / "iter_2.pth").write_text(hashlib.sha256(buf.getvalue()).hexdigest() + "\n")
    (work / LAST_CHECKPOINT).write_text("iter_2.pth\n")
    found, loaded = load_resume_checkpoint(work)
    assert found == work / "iter_1.pth" and loaded["step"] == 1
    assert "iter_2.pth" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"iter_2.pth: .*optimiser state"):
        find_checkpoint(work, work / "iter_2.pth")
