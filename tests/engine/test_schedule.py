import pytest
import torch

from wsss.engine.schedule import PolyWarmupScheduler, lr_at


def test_lr_at_reference_points():
    base, total = 6e-5, 80000
    assert lr_at(0, base, total, 2500, 1e-6, 0.9) == pytest.approx(base * 1e-6)
    assert lr_at(1250, base, total, 2500, 1e-6, 0.9) == pytest.approx(base * (0.5 + 0.5 * 1e-6))
    assert lr_at(2499, base, total, 2500, 1e-6, 0.9) == pytest.approx(base * (1 - (1 / 2500) * (1 - 1e-6)))
    # Poly counts from iteration 0: at the end of the warm-up, (1 - 2500/80000)^0.9 = 0.97183.
    assert lr_at(2500, base, total, 2500, 1e-6, 0.9) == pytest.approx(base * (1 - 2500 / 80000) ** 0.9)
    assert lr_at(2500, base, total, 2500, 1e-6, 0.9) / base == pytest.approx(0.971831, abs=1e-6)
    assert lr_at(40000, base, total, 2500, 1e-6, 0.9) == pytest.approx(base * 0.5**0.9)
    assert lr_at(79999, base, total, 2500, 1e-6, 0.9) == pytest.approx(base * (1 / 80000) ** 0.9)
    assert lr_at(80000, base, total, 2500, 1e-6, 0.9) == 0.0
    assert lr_at(90000, base, total, 2500, 1e-6, 0.9) == 0.0


def _optimizer(lr=6e-5):
    backbone = torch.nn.Linear(2, 2)
    head = torch.nn.Linear(2, 2)
    return torch.optim.AdamW(
        [{"params": backbone.parameters(), "lr": lr}, {"params": head.parameters(), "lr": 10 * lr}]
    )


def _run(opt, sched, steps):
    seen = []
    for _ in range(steps):
        seen.append([g["lr"] for g in opt.param_groups])
        opt.step()
        sched.step()
    return seen


def test_scheduler_follows_lr_at_and_keeps_group_ratio():
    opt = _optimizer()
    sched = PolyWarmupScheduler(opt, max_iters=100, warmup_iters=10, warmup_ratio=1e-6, power=0.9)
    seen = _run(opt, sched, 100)
    for it in (0, 5, 10, 50, 99):
        assert seen[it][0] == pytest.approx(lr_at(it, 6e-5, 100, 10, 1e-6, 0.9))
        assert seen[it][1] == pytest.approx(lr_at(it, 6e-4, 100, 10, 1e-6, 0.9))
    assert [g["lr"] for g in opt.param_groups] == [0.0, 0.0]


def test_scheduler_resume_is_exact():
    opt = _optimizer()
    sched = PolyWarmupScheduler(opt, max_iters=100, warmup_iters=10, warmup_ratio=1e-6, power=0.9)
    full = _run(opt, sched, 60)

    opt_a = _optimizer()
    sched_a = PolyWarmupScheduler(opt_a, max_iters=100, warmup_iters=10, warmup_ratio=1e-6, power=0.9)
    _run(opt_a, sched_a, 25)
    state = sched_a.state_dict()

    # A fresh optimiser (its lrs at the base values) and scheduler, resumed from the state alone.
    opt_b = _optimizer()
    sched_b = PolyWarmupScheduler(opt_b, max_iters=100, warmup_iters=10, warmup_ratio=1e-6, power=0.9)
    sched_b.load_state_dict(state)
    assert sched_b.last_epoch == 25
    resumed = _run(opt_b, sched_b, 35)
    assert resumed == full[25:]
