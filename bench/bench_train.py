"""One command that measures the training step and the inference path at the paper setting.

    python bench/bench_train.py --device cuda        # or: make bench-gpu

1. ``--steps`` real training iterations (the loop's :func:`wsss.engine.train.iteration_runner`: the step, the
   device-side non-finite guard, fused AdamW, the schedule; on CUDA replayed as graphs with ``train.cuda_graphs``)
   on random crops at the paper setting: DeiT-S/16 with centered attention (``--config``), batch 4, 448 crops,
   3-scale + flip CAM, PAR pseudo labels, balanced CE, dense energy; it/s. With graphs, the same iterations eagerly
   too (same model and optimiser, after the graphed ones).
2. Each stage alone, with the same inputs: forward + backward, the CAM pass, PAR pseudo labels, seg CE (its logits
   resized by ``loss.seg_resize``, then by the other method), the energy loss (blocked, and on CUDA also the fused
   Triton kernel; then the reference's permutohedral lattice, ``loss.reg_kernel=lattice``), the optimiser step; on
   CUDA also each stage captured as a CUDA graph and replayed (its GPU time without the host's launches), beside its
   H100 lower bound from bench/step_on_paper.py.
3. Peak memory (CUDA allocated; the process's peak RSS on a CPU).
4. Inference: ``infer.scales`` + flip on ``--images`` random 500 x 375 images, and the confusion-matrix evaluator
   on the same device.
5. ``--attention explicit``: the attention variants' explicit path (:func:`wsss.models.set_fused_attention`), the
   ``n x n`` matrix by matrix products as the reference computes it, where SDPA's float32 kernel (the only one that
   takes float32) computes each product as three TF32 ones (docs/benchmarks.md, "Attention in float32 is three TF32
   products"): whether the float32 step gains from one TF32 product each more than the matrices' traffic costs.
6. With ``--kernels N``: each stage's kernels in one profiled eager call (``torch.profiler``): how many ran, their
   time summed (the GPU's busy time, against the stage's graph), and the N that took the most; on a CPU the operators'
   own times instead. Where a stage is far above its bound, this says whether its kernels are few and slow or many
   and small.

Exits 1 if any loss, gradient, logit or count is non-finite or wrong. On a CPU the defaults shrink (crop 112,
2 steps, 2 images; the fused kernel is skipped, it runs there only in Triton's interpreter) so the command ends
in minutes; every size can still be given.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
import time

import torch
from _common import kernel_times, print_kernels, rss_bytes, synchronize, timed
from step_on_paper import stages as paper_bounds

from wsss.cam import multiscale_cam
from wsss.config import load_config, parse_cfg_options
from wsss.data.transforms import backbone_mean_std
from wsss.engine.graphs import CudaGraphs
from wsss.engine.optim import NonFiniteGuard, NonFiniteLossError, build_optimizer
from wsss.engine.schedule import PolyWarmupScheduler
from wsss.engine.step import TrainingStep
from wsss.engine.train import LossMeter, iteration, iteration_runner, to_device
from wsss.evaluation.metrics import ConfusionMatrix
from wsss.losses import DenseEnergyLoss, balanced_seg_ce
from wsss.models import PixelResize, build_model, maps_to_pixels, set_fused_attention
from wsss.models.tta import tta_forward
from wsss.pseudo_label import boxes_to_mask, pseudo_labels
from wsss.utils.tensors import fp32_precision

PAPER = {"batch": 4, "size": 448, "steps": 50, "images": 16}
CPU = {"batch": 2, "size": 112, "steps": 2, "images": 2}
IMAGE_SIZE = (375, 500)  # a typical VOC photo


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/voc_centered.py")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch", type=int, help=f"crops per step (paper {PAPER['batch']}; CPU {CPU['batch']})")
    parser.add_argument("--size", type=int, help=f"crop edge (paper {PAPER['size']}; CPU {CPU['size']})")
    parser.add_argument("--steps", type=int, help=f"timed iterations (default {PAPER['steps']}; CPU {CPU['steps']})")
    parser.add_argument("--warmup", type=int, default=3, help="untimed iterations first (compilation, autotuning)")
    parser.add_argument("--repeats", type=int, default=5, help="timings per stage (the median is printed)")
    parser.add_argument("--images", type=int, help=f"inference images (default {PAPER['images']}; CPU {CPU['images']})")
    parser.add_argument("--threads", type=int, help="torch CPU threads")
    parser.add_argument("--cfg-options", nargs="+", metavar="KEY=VALUE", help="override config values")
    parser.add_argument("--attention", choices=("fused", "explicit"), default="fused",
                        help="the variants' attention path: SDPA's kernel (the library's), or the n x n matrix by "
                             "matrix products (the reference's computation; in float32 one TF32 product each on a GPU "
                             "where SDPA's float32 kernel takes three)")  # fmt: skip
    parser.add_argument("--kernels", type=int, default=0, metavar="N",
                        help="per stage, the N kernels that took the most time in one profiled call (0: none)")
    args = parser.parse_args(argv)
    defaults = PAPER if torch.device(args.device).type == "cuda" else CPU
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def timed_stage(fn, repeats: int, device: torch.device) -> tuple[float, float | None, object]:
    """:func:`timed` eagerly and, on CUDA, as a replayed CUDA graph of ``fn`` (None on a CPU)."""
    eager, out = timed(fn, repeats, device)
    if device.type != "cuda":
        return eager, None, out
    backend = CudaGraphs()
    backend.warmup(fn)
    try:
        graph, out = backend.capture(fn)
    except RuntimeError as err:  # the stage's row keeps its eager time; the other stages go on
        print(f"warning: {getattr(fn, '__name__', 'a stage')} could not be captured as a CUDA graph: {err}",
              file=sys.stderr)  # fmt: skip
        return eager, None, out
    replayed, _ = timed(graph.replay, repeats, device)
    return eager, replayed, out


def stage_bounds(cfg, amp: bool, cam_bf16: bool) -> dict[str, float]:
    """The H100 lower bound (seconds) of each stage of :func:`main`'s table that bench/step_on_paper.py counts; none
    for another backbone than the paper's DeiT-S, whose shapes step_on_paper.py counts whatever the config."""
    if cfg.model.backbone != "deit_small_patch16_224" or cfg.model.backbone_kwargs:
        return {}
    rows = {name: seconds for name, _, _, _, seconds in paper_bounds(cfg)}

    def row(prefix: str) -> float:
        return next(v for k, v in rows.items() if k.startswith(prefix))

    return {
        "forward + backward": row("forward + backward, train.amp" if amp else
                                  "forward + backward, float32, TF32" if cfg.train.fp32_precision == "tf32" else
                                  "forward + backward, float32, train.fp32_precision=ieee"),  # fmt: skip
        "optimiser": row("fused AdamW"),
        "CAM pass": row("CAM pass, train.cam_dtype=bfloat16" if cam_bf16 else
                        "CAM pass, float32, TF32" if cfg.train.fp32_precision == "tf32" else
                        "CAM pass, float32, train.fp32_precision=ieee"),  # fmt: skip
        "PAR": row("PAR"),
        "seg CE": row("seg CE"),
        "energy loss, blocked": row("energy, blocked"),
        "energy loss, fused": row("energy, fused"),
        "energy loss, lattice": row("energy, lattice"),
    }


def peak_memory(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.max_memory_allocated(device) / 2**30:.2f} GiB (CUDA, allocated)"
    return f"{rss_bytes('VmHWM') / 2**30:.2f} GiB (process peak RSS)"


def random_batch(b: int, s: int, num_fg: int, device: torch.device) -> dict:
    """Random crops, 1-3 classes each, half of them with a valid box smaller than the crop (padding)."""
    g = torch.Generator().manual_seed(0)
    label = torch.zeros(b, num_fg)
    for i in range(b):
        label[i, torch.randperm(num_fg, generator=g)[: 1 + i % 3]] = 1.0
    box = torch.tensor([[0, s, 0, s] if i % 2 == 0 else [s // 8, s, 0, s - s // 5] for i in range(b)])
    return to_device({"image": torch.randn(b, 3, s, s, generator=g), "label": label, "box": box}, device)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    opts = {**parse_cfg_options(args.cfg_options), "model.pretrained": "", "train.batch_size": args.batch,
            "data.crop_size": args.size}
    cfg = load_config(args.config, opts)
    with fp32_precision(cfg.train.fp32_precision):  # as tools/train.py runs
        return measure(args, cfg)


def measure(args: argparse.Namespace, cfg) -> int:
    """:func:`main`'s measurements with the resolved config; the exit status."""
    device = torch.device(args.device)
    mean, std = backbone_mean_std(cfg.model.backbone)
    num_classes = len(cfg.data.classes)
    torch.manual_seed(0)
    model = build_model(cfg.model, num_classes).to(device).train()
    set_fused_attention(model, args.attention == "fused")
    optimizer = build_optimizer(model, cfg.optim)
    o = cfg.optim
    scheduler = PolyWarmupScheduler(optimizer, cfg.train.max_iters, o.warmup_iters, o.warmup_ratio, o.power)
    guard, meter = NonFiniteGuard(optimizer), LossMeter()
    step = TrainingStep(cfg, mean, std, device)
    run = iteration_runner(cfg, device, False, model, model, step, optimizer, scheduler, guard, meter)
    graphs = device.type == "cuda" and cfg.train.cuda_graphs
    b, s = args.batch, args.size
    batch = random_batch(b, s, num_classes - 1, device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(
        f"{cfg.model.backbone} / {cfg.model.attention.name}, batch {b}, {s}x{s}, CAM scales {cfg.cam.scales} + flip, "
        f"PAR {cfg.par.num_iter} it, energy kernel {cfg.loss.reg_kernel!r}, bf16 autocast {step.amp}, CAM pass "
        f"{'bfloat16' if step.cam_autocast else 'float32'}, float32 products {cfg.train.fp32_precision}, CUDA graphs "
        f"{graphs}, attention {args.attention}; {name}"
    )

    # 1. the real loop body; every term is on from loss.seg_start_iter
    first = cfg.loss.seg_start_iter

    def loop(body, start: int) -> float:
        """Seconds per iteration of ``body(batch, it)`` over ``--steps`` after ``--warmup`` (and the graph capture)."""
        for it in range(start, start + args.warmup + (cfg.train.cuda_graph_warmup if graphs else 0)):
            body(batch, it)
        synchronize(device)
        tic = time.perf_counter()
        for it in range(start + 100, start + 100 + args.steps):
            body(batch, it)
        synchronize(device)
        return (time.perf_counter() - tic) / args.steps

    per_step = loop(run, first)
    eager_step = None
    if graphs:  # the same model and optimiser, eagerly (its rates now device tensors, read as they are)
        eager_step = loop(functools.partial(iteration, model, model, step, optimizer=optimizer, scheduler=scheduler,
                                            guard=guard, meter=meter), first + 1000)  # fmt: skip
    try:
        guard.raise_if_tripped(None)
    except NonFiniteLossError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    losses = meter.pop()

    # 2. the stages alone: (eager s, graph replay s or None, bound key)
    rows: dict[str, tuple[float, float | None, str | None]] = {}
    profiled: dict[str, list[tuple[str, int, float]]] = {}

    def stage(label: str, bound: str | None, fn):
        eager, replayed, out = timed_stage(fn, args.repeats, device)
        rows[label] = eager, replayed, bound
        if args.kernels:
            profiled[label] = kernel_times(fn, device)
        return out

    def forward_backward() -> None:
        loss, _ = step(model, model, batch, 0)  # before seg_start_iter: cls + aux, decoder kept in the graph
        loss.backward()

    stage("forward + backward (cls, aux; decoder in the graph)", "forward + backward", forward_backward)
    finite_loss = torch.zeros((), device=device)

    def update() -> None:  # on the gradients of the last forward_backward
        guard.update(finite_loss, first)
        optimizer.step()

    stage("optimiser (non-finite guard + fused AdamW)", "optimiser", update)

    def cam() -> torch.Tensor:
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=step.cam_autocast,
                                             cache_enabled=False):  # fmt: skip
            return multiscale_cam(model.cam, batch["image"], batch["label"], cfg.cam.scales)

    cams = stage(f"CAM pass ({len(cfg.cam.scales)} scales + flip, no grad)", "CAM pass", cam).clone()
    targets = step.targets(model, batch)
    valid = boxes_to_mask(batch["box"], s, s)

    def pseudo() -> torch.Tensor:
        return pseudo_labels(
            targets.rgb, cams, batch["label"], valid, step.par, cfg.cam.fg_thresh, cfg.cam.bg_thresh, cfg.par.scale,
            cfg.data.ignore_index, batch["max_present"],
        )  # fmt: skip

    stage(f"PAR pseudo labels ({cfg.par.num_iter} iterations, 2 thresholds)", "PAR", pseudo)
    stride = model.stride
    seg = torch.randn(b, num_classes, s // stride, s // stride, device=device, requires_grad=True)
    resizes = {"matmul": PixelResize(), "interpolate": maps_to_pixels}  # loss.seg_resize first, then the other
    for method in sorted(resizes, key=lambda m: m != cfg.loss.seg_resize):

        def seg_loss(to_pixels=resizes[method]) -> None:
            up = to_pixels(seg, (s, s), stride)
            balanced_seg_ce(up, targets.label, cfg.data.ignore_index).backward()

        stage(f"seg CE forward + backward (logits resized by {method})", "seg CE", seg_loss)
    kernels = ("blocked", "fused", "lattice") if device.type == "cuda" else ("blocked", "lattice")
    for kernel in kernels:
        energy = DenseEnergyLoss.from_config(dataclasses.replace(cfg.loss, reg_kernel=kernel), cfg.data.ignore_index)

        def energy_loss(energy=energy) -> torch.Tensor:
            up = step.to_pixels(seg, (s, s), stride)
            value = energy(targets.rgb * 255.0, up.softmax(dim=1), targets.valid, targets.label)
            value.backward()
            return value.detach()

        value = stage(f"energy loss, {kernel} (scale {cfg.loss.reg_scale}, forward + backward)",
                      f"energy loss, {kernel}", energy_loss)  # fmt: skip
        losses[f"energy ({kernel})"] = float(value)

    # 3. inference and the evaluator
    model.eval()
    images = torch.randn(args.images, 3, *IMAGE_SIZE, device=device)
    gts = torch.randint(0, num_classes, (args.images, *IMAGE_SIZE), device=device)
    synchronize(device)
    tic = time.perf_counter()
    preds, finite_logits = [], torch.ones((), dtype=torch.bool, device=device)
    for image in images:
        out = tta_forward(model, image[None], cfg.infer.scales, cfg.infer.flip)
        preds.append(out.seg.argmax(dim=1)[0])
        finite_logits &= torch.isfinite(out.seg).all()
    synchronize(device)
    infer_s = (time.perf_counter() - tic) / args.images

    def evaluate() -> ConfusionMatrix:
        cm = ConfusionMatrix(num_classes, cfg.data.ignore_index, device=device)
        for pred, gt in zip(preds, gts, strict=True):
            cm.update(pred, gt)
        return cm

    eval_s, cm = timed(evaluate, args.repeats, device)

    bounds = stage_bounds(cfg, step.amp, step.cam_autocast)
    print("\n| stage | ms | share of one iteration | as a CUDA graph, ms | H100 bound, ms | graph / bound |")
    print("|---|---:|---:|---:|---:|---:|")
    loop_name = "CUDA graphs" if graphs else "eager"
    print(f"| one training iteration, {loop_name} ({args.steps} timed) | {per_step * 1e3:.1f} | 100% | | | |")
    if eager_step is not None:
        print(f"| one training iteration, eager ({args.steps} timed) | {eager_step * 1e3:.1f} | "
              f"{eager_step / per_step:.0%} | | | |")  # fmt: skip
    for label, (sec, replayed, bound) in rows.items():
        graph_ms = f"{replayed * 1e3:.1f}" if replayed is not None else ""
        bound_ms = f"{bounds[bound] * 1e3:.2f}" if bound in bounds else ""
        ratio = f"{replayed / bounds[bound]:.1f}x" if replayed is not None and bound in bounds else ""
        print(f"| {label} | {sec * 1e3:.1f} | {sec / per_step:.0%} | {graph_ms} | {bound_ms} | {ratio} |")
    print(f"| inference, {len(cfg.infer.scales)} scales + flip, {IMAGE_SIZE[1]}x{IMAGE_SIZE[0]}, per image | "
          f"{infer_s * 1e3:.1f} | |")  # fmt: skip
    print(f"| evaluator, {args.images} masks on {device.type} | {eval_s * 1e3:.1f} | |")
    eager_rate = f"; eager {1 / eager_step:.2f}" if eager_step is not None else ""
    print(f"\niterations/s: {1 / per_step:.2f} ({loop_name}{eager_rate}; goal on one H100: 30 with the bf16 CAM pass, "
          f"20 with float32); 20k iterations: {20000 * per_step / 60:.1f} min")  # fmt: skip
    energy = {kernel: next(v[0] for k, v in rows.items() if k.startswith(f"energy loss, {kernel} "))
              for kernel in kernels}  # fmt: skip
    if "fused" in energy:
        print(f"energy loss fused / blocked time: {energy['fused'] / energy['blocked']:.3f} "
              f"({energy['fused'] * 1e3:.1f} ms, goal <= 5 ms)")  # fmt: skip
    print(f"energy loss lattice (the reference's W) / blocked time: {energy['lattice'] / energy['blocked']:.3f} "
          f"({energy['lattice'] * 1e3:.1f} ms)")  # fmt: skip
    print(f"peak memory: {peak_memory(device)}")
    for label, found in profiled.items():
        print_kernels(label, found, args.kernels, device.type == "cuda", rows[label][1], "its graph's")
    print("losses: " + ", ".join(f"{k} {v:.4g}" for k, v in losses.items()))
    problems = [k for k, v in losses.items() if not torch.isfinite(torch.tensor(v))]
    if not bool(finite_logits):
        problems.append("inference logits")
    if int(cm.matrix.sum()) + cm.num_ignored + cm.num_out_of_range != gts.numel():
        problems.append("evaluator pixel count")
    if problems:
        print(f"error: non-finite or wrong: {', '.join(problems)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
