"""``train.cuda_graphs``: the training iterations run through captured and replayed graphs equal the eager loop.

On the CPU the graphs are :class:`wsss.engine.graphs.ReplayGraphs` (every ATen operation of a capture recorded and
run again), which freeze what the Python code read while capturing exactly as CUDA graphs do. Where a GPU is visible,
the same comparison runs with real CUDA graphs.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from tests.conftest import tiny_config
from tests.fake_cuda import REAL_GPU
from wsss.config import Config
from wsss.data.transforms import backbone_mean_std
from wsss.engine.graphs import GraphedIteration, ReplayGraphs
from wsss.engine.optim import NonFiniteGuard, build_optimizer
from wsss.engine.schedule import PolyWarmupScheduler
from wsss.engine.step import TrainingStep
from wsss.engine.train import LossMeter, iteration, to_device
from wsss.models import build_model

pytestmark = pytest.mark.usefixtures("one_thread")

LABELS = ([[1.0, 0.0], [1.0, 1.0]], [[1.0, 0.0], [0.0, 1.0]])
"""Alternating batches with 2 and 1 classes in their fullest image: two kinds of iteration in each phase."""
SEG_START = 6
NAN_AT = 10
"""A NaN crop at this iteration (a replay): the guard must name it, and skip every update from it on."""


def config(tmp_path) -> Config:
    cfg = tiny_config(tmp_path, max_iters=40)
    cfg.loss.seg_start_iter = SEG_START  # iterations 0-5 classification only, then every term
    cfg.loss.reg_kernel = "blocked"
    cfg.optim.warmup_iters = 8  # the learning rate changes at every iteration
    return cfg


def make_batches(n: int) -> list[dict]:
    g = torch.Generator().manual_seed(3)
    batches = []
    for i in range(n):
        image = torch.randn(2, 3, 32, 32, generator=g)
        if i == NAN_AT:
            image[1, 0, 5, 5] = float("nan")
        box = torch.tensor([[0, 32, 0, 32], [4 + i % 3, 32, 0, 28]])
        batches.append({"image": image, "label": torch.tensor(LABELS[i % 2]), "box": box})
    return batches


@dataclasses.dataclass
class Run:
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    guard: NonFiniteGuard
    logged: list[dict[str, float]]
    runner: GraphedIteration | None


def train(cfg: Config, model, batches: list[dict], device: torch.device, backend=None) -> Run:
    """The loop of wsss/engine/train.py: eager (``backend`` None) or graphed; the loss meter read every 3 iterations,
    as at a log interval."""
    torch.manual_seed(1)  # drop path draws the same masks in both runs
    mean, std = backbone_mean_std(cfg.model.backbone)
    model = model.to(device).train()
    optimizer = build_optimizer(model, cfg.optim)
    o = cfg.optim
    scheduler = PolyWarmupScheduler(optimizer, cfg.train.max_iters, o.warmup_iters, o.warmup_ratio, o.power)
    step = TrainingStep(cfg, mean, std, device)
    guard, meter, logged = NonFiniteGuard(optimizer), LossMeter(), []
    runner = None
    if backend is not None:
        runner = GraphedIteration(model, step, optimizer, scheduler, guard, warmup=1, backend=backend)
    for it, batch in enumerate(batches):
        batch = to_device(batch, device)
        if runner is None:
            iteration(model, model, step, batch, it, optimizer, scheduler, guard, meter)
        else:
            loss, terms = runner(batch, it)
            meter.add({**terms, "loss": loss})
        if it % 3 == 2:
            logged.append(meter.pop())
    return Run(model, optimizer, guard, logged, runner)


@pytest.mark.parametrize("scheduler_writes", ["in place", "a float"])
def test_replayed_graphs_train_exactly_as_the_eager_loop(tmp_path, monkeypatch, scheduler_writes):
    """Also where the schedule assigns each rate as a float (torch's LRScheduler did before it learnt tensor rates):
    the runner writes it into the tensor its graphs read."""
    if scheduler_writes == "a float":
        monkeypatch.setattr(torch.optim.lr_scheduler, "_update_param_group_val",
                            lambda group, key, value: group.__setitem__(key, float(value)))  # fmt: skip
    cfg = config(tmp_path)
    model, batches = build(cfg), make_batches(15)
    eager = train(cfg, copy.deepcopy(model), batches, torch.device("cpu"))
    backend = ReplayGraphs()
    graphed = train(cfg, copy.deepcopy(model), batches, torch.device("cpu"), backend)

    # 4 kinds (2 phases x 2 class counts), each warmed up once (iterations 0, 1, 6, 7), captured once (2, 3, 8, 9),
    # then replayed
    assert len(graphed.runner.graphs) == 4 and [g.replays for g in backend.graphs] == [1, 1, 3, 2]
    assert [list(d) for d in graphed.logged] == [list(d) for d in eager.logged]
    got, want = ([torch.tensor(list(d.values())) for d in run.logged] for run in (graphed, eager))
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)  # every term of every interval, to the bit
    assert torch.isnan(got[NAN_AT // 3]).any() and torch.isfinite(got[-1]).all()  # the NaN iteration's interval
    for p, q in zip(graphed.model.parameters(), eager.model.parameters(), strict=True):
        assert torch.equal(p, q)
    assert any(not torch.equal(p, q) for p, q in zip(eager.model.parameters(), model.parameters(), strict=True))
    assert graphed.guard.first_step.item() == eager.guard.first_step.item() == NAN_AT
    lrs = [float(g["lr"]) for g in graphed.optimizer.param_groups]
    assert lrs == pytest.approx([g["lr"] for g in eager.optimizer.param_groups], rel=1e-6)
    for s, t in zip(graphed.optimizer.state.values(), eager.optimizer.state.values(), strict=True):
        assert torch.equal(s["step"], t["step"]) and torch.equal(s["exp_avg"], t["exp_avg"])


def build(cfg: Config):
    torch.manual_seed(0)
    return build_model(cfg.model, num_classes=3)


@pytest.mark.skipif(not REAL_GPU, reason="needs a GPU: CUDA graphs (the CPU replays recorded operations, above)")
def test_cuda_graphs_train_as_the_eager_loop_on_the_gpu(tmp_path):
    """The same comparison with real CUDA graphs: the same kernels, but the learning rate is read as float32 (1 ulp
    from the eager loop's double) and bf16 autocast rounds what differs, so the terms agree closely, not to the bit.
    Without drop path: a replay draws its random numbers from offsets of its own, not necessarily the eager loop's
    (the CPU test above replays them exactly)."""
    from wsss.engine.graphs import CudaGraphs

    cfg = config(tmp_path)
    cfg.model.drop_path_rate = 0.0
    model, batches = build(cfg), make_batches(15)
    cuda = torch.device("cuda")
    eager = train(cfg, copy.deepcopy(model), batches, cuda)
    graphed = train(cfg, copy.deepcopy(model), batches, cuda, CudaGraphs())
    assert len(graphed.runner.graphs) == 4
    got, want = ([torch.tensor(list(d.values())) for d in run.logged] for run in (graphed, eager))
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-5, equal_nan=True)
    for p, q in zip(graphed.model.parameters(), eager.model.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-3, atol=1e-5)
    assert graphed.guard.first_step.item() == eager.guard.first_step.item() == NAN_AT
