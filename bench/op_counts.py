"""Operations the host dispatches per training iteration, per stage: a GPU step's launch overhead, counted on a CPU.

    python bench/op_counts.py [--config configs/voc_centered.py] [--cfg-options KEY=VALUE ...]

Counts non-view ATen operations (:mod:`wsss.utils.op_count`; on a GPU about one kernel launch each) of one iteration
of :func:`wsss.engine.train.iteration` after ``loss.seg_start_iter`` (every term) at the config's batch, CAM scales,
PAR and energy kernel, on the GPU's paths run here in Triton's interpreter (PAR's kernels, and the lattice's with
its codes fixed in advance; ``--cfg-options par.kernel=torch`` for PAR's PyTorch path, ``loss.reg_kernel=fused`` for
the exact energy kernel), attributed to the stage that ran them. The counts do not depend on the crop size, so the crop
defaults to 64 px (``--size``) to keep the interpreter fast. Each Triton launch counts as one operation (what the
interpreter dispatches inside it, nothing: :meth:`wsss.utils.op_count.OpCounter.launches`).

Then the same iteration through ``train.cuda_graphs`` (:class:`wsss.engine.graphs.GraphedIteration`, replayed by
:class:`wsss.engine.graphs.ReplayGraphs`, the CPU's twin of CUDA graphs): the operations the host still dispatches
around the replay (the batch copied in, the iteration index, the schedule), the replay itself counted as one.
"""

from __future__ import annotations

import argparse
import os
import types

os.environ.setdefault("TRITON_INTERPRET", "1")  # the Triton kernels on CPU tensors

import torch  # noqa: E402
from bench_train import random_batch  # noqa: E402

from wsss import energy_kernel, par_kernel  # noqa: E402
from wsss.config import load_config, parse_cfg_options  # noqa: E402
from wsss.data.transforms import backbone_mean_std  # noqa: E402
from wsss.engine import graphs, step  # noqa: E402
from wsss.engine.graphs import GraphedIteration, ReplayGraphs  # noqa: E402
from wsss.engine.optim import NonFiniteGuard, build_optimizer  # noqa: E402
from wsss.engine.schedule import PolyWarmupScheduler  # noqa: E402
from wsss.engine.step import TrainingStep  # noqa: E402
from wsss.engine.train import LossMeter, iteration  # noqa: E402
from wsss.inference.crf import kernels as crf_kernels  # noqa: E402
from wsss.losses import DenseEnergyLoss  # noqa: E402
from wsss.models import build_model  # noqa: E402
from wsss.utils.op_count import OpCounter  # noqa: E402

STAGES = ("model forward", "CAM pass", "PAR pseudo labels", "seg CE", "energy loss", "backward", "guard + optimiser",
          "other (zero grad, schedule, meter)")  # fmt: skip
KERNELS = ((energy_kernel, "_gaussian_filter_kernel"), (par_kernel, "_affinity_kernel"),
           (par_kernel, "_propagate_kernel"), (crf_kernels, "_simplex_kernel"), (crf_kernels, "_product_kernel"),
           (crf_kernels, "_blur_kernel"))  # the last three: the energy's lattice (loss.reg_kernel=lattice)
ORIGINAL_KERNELS = [getattr(module, name) for module, name in KERNELS]


def staged(counter: OpCounter, name: str, fn):
    def run(*args, **kwargs):
        with counter.stage(name):
            return fn(*args, **kwargs)

    return run


def instrument(counter: OpCounter, optimizer, guard, model) -> None:
    """Attribute every operation of an iteration to its stage (patches this process's functions)."""
    step.multiscale_cam = staged(counter, "CAM pass", step.multiscale_cam)
    step.pseudo_labels = staged(counter, "PAR pseudo labels", step.pseudo_labels)
    step.balanced_seg_ce = staged(counter, "seg CE", step.balanced_seg_ce)
    DenseEnergyLoss.forward = staged(counter, "energy loss", DenseEnergyLoss.forward)
    torch.Tensor.backward = staged(counter, "backward", torch.Tensor.backward)
    update = staged(counter, "guard + optimiser", optimizer.step)
    optimizer.step = types.MethodType(lambda self, *args, **kwargs: update(*args, **kwargs), optimizer)  # bound
    guard.update = staged(counter, "guard + optimiser", guard.update)
    model.forward = staged(counter, "model forward", model.forward)
    for (module, name), kernel in zip(KERNELS, ORIGINAL_KERNELS, strict=True):
        setattr(module, name, counter.launches(kernel))


def count_iterations(cfg, size: int) -> tuple[dict[str, int], int]:
    """Operations of one eager iteration per stage, and of one replayed iteration in all."""
    device = torch.device("cpu")
    mean, std = backbone_mean_std(cfg.model.backbone)
    n = len(cfg.data.classes)
    batch = random_batch(cfg.train.batch_size, size, n - 1, device)
    counts = {}
    for graphed in (False, True):
        torch.manual_seed(0)
        model = build_model(cfg.model, n).train()
        optimizer = build_optimizer(model, cfg.optim)
        guard, meter, counter = NonFiniteGuard(optimizer), LossMeter(), OpCounter()
        instrument(counter, optimizer, guard, model)  # before the schedule, which wraps optimizer.step
        o = cfg.optim
        scheduler = PolyWarmupScheduler(optimizer, cfg.train.max_iters, o.warmup_iters, o.warmup_ratio, o.power)
        train_step = TrainingStep(cfg, mean, std, device)
        train_step.energy.lattice_kernels = True  # with loss.reg_kernel=lattice, the GPU's path (Triton, fixed codes)
        first = cfg.loss.seg_start_iter
        if graphed:  # PyTorch's kernels: the recording cannot hold the interpreter's copies (not counted)
            train_step.energy.kernel, train_step.par.kernel = "blocked", "torch"
            runner = GraphedIteration(model, train_step, optimizer, scheduler, guard, warmup=1, backend=ReplayGraphs())
            for it in range(first, first + 2):  # warm-up, capture
                runner(batch, it)
            replay = graphs._RecordedGraph.replay

            def paused(self, counter=counter, replay=replay):  # one call from the host
                counter.counts["graph replay"] += 1
                with counter.pause():
                    replay(self)

            graphs._RecordedGraph.replay = paused
            with counter:
                loss, terms = runner(batch, first + 2)
                meter.add({**terms, "loss": loss})
            graphs._RecordedGraph.replay = replay
            counts["graphed"] = sum(counter.counts.values())
        else:
            iteration(model, model, train_step, batch, first, optimizer, scheduler, guard, meter)  # warm-up
            with counter:
                iteration(model, model, train_step, batch, first + 1, optimizer, scheduler, guard, meter)
            counts["eager"] = {stage: counter.counts.get("other" if stage.startswith("other") else stage, 0)
                               for stage in STAGES}  # fmt: skip
    return counts["eager"], counts["graphed"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/voc_centered.py")
    parser.add_argument("--size", type=int, default=64, help="crop edge (the counts do not depend on it)")
    parser.add_argument("--cfg-options", nargs="+", metavar="KEY=VALUE", help="override config values")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    opts = {"model.pretrained": "", "par.kernel": "fused", "data.crop_size": args.size,
            **parse_cfg_options(args.cfg_options)}  # fmt: skip
    cfg = load_config(args.config, opts)
    eager, graphed = count_iterations(cfg, args.size)
    print(f"{args.config}: batch {cfg.train.batch_size}, CAM scales {cfg.cam.scales} + flip, PAR {cfg.par.num_iter} "
          f"iterations x {len(cfg.par.dilations)} dilations ({cfg.par.kernel}), "
          f"energy kernel {cfg.loss.reg_kernel}")  # fmt: skip
    print("| stage | operations dispatched |")
    print("|---|---:|")
    for stage, count in eager.items():
        print(f"| {stage} | {count} |")
    print(f"| **one eager iteration** | **{sum(eager.values())}** |")
    print(f"| **one iteration replayed as a graph** (train.cuda_graphs) | **{graphed}** |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
