"""Inference throughput: single scale vs multi-scale + flip vs + dense CRF, and the CRF pool's speed-up.

Writes ``--num`` generated images (the toy generator's scenes, resized to ``--size``, 500x375 by default:
the VOC shape) to a temporary folder, builds a randomly initialised model from each ``--configs`` file
(``model.pretrained=""``; the timing depends on the architecture, not the weights), saves it as a checkpoint
and times :func:`wsss.inference.folder.runner.run_inference` (the loop of ``tools/infer.py``: decoding, model, CRF
pool, writing the masks) in three modes:

- ``single``: scale 1.0, no flip, no CRF;
- ``ms+flip``: scales 1.0, 1.25, 1.5 with flips (the paper's inference), no CRF;
- ``ms+flip+crf``: the same plus the dense CRF (``infer.crf.backend``: torch by default; ``--crf-workers``
  processes of the pydensecrf backend).

images/s = images / the loop's wall time (model loading and CRF worker start-up excluded, as in the
summary ``tools/infer.py`` prints). Each mode runs ``--repeats`` times (``--overwrite``), the best is kept.

Two more rows per mode bound the loop from both sides:

- ``model alone``: :func:`wsss.models.tta.tta_forward` of the mode's scales and flip on batches of ``--batch-size``
  normalised images already on the device, nothing else (the bound the loop approaches);
- ``loop alone``: the same ``run_inference`` with a model that costs nothing (:class:`FreeModel`: each input shape's
  outputs computed once, in an untimed first run, then returned as they are), so what is timed is the loop's own
  work: decoding, preprocessing, TTA resizing, the masks, the CRF in its mode, PNG writing, Python. It runs on any
  machine, the CPU included: the CPU proxy of the GPU loop's overhead.

The loop rows also give the CPU time of the loop's own thread per image (``time.thread_time`` around
:meth:`~wsss.inference.folder.loop.InferenceLoop.run`: without the decoding processes and the writing threads), the
host's serial share, at each ``--write-threads`` count.

``--profile N``: each loop row once more, its thread under cProfile on that thread's CPU clock (on a GPU a wait for
the device spins, so it shows as the CPU time of the call that waits): the N functions with the most own CPU time,
per image, and on CUDA the GPU's kernels summed over that run (``torch.profiler``) against its wall time. Where the
loop is far from the model alone, this says whether the host's own work or the device holds it.

``--case coco``: 640 x 480 images and ``configs/coco_centered.py`` (81 classes) by default, the COCO-sized case.

``--memory``: each mode runs once more, untimed, and its peak memory is printed: on CUDA the most the loop allocated
on the device (``torch.cuda.max_memory_allocated`` above what was allocated before it: the model it loads, its
batches, the CRF); on a CPU the CPU's stand-in for that figure, the most this process's tensors held at once during
the run (the allocator's events under ``torch.profiler``), with the CRF in this process and its images grouped into
runs by the memory budget alone, as on a GPU (``infer.crf.kernel=torch`` there: the GPU's Triton kernels need no more),
and the host's own tensors (decoded images, masks copied back) counted too.

CRF pool: the dense CRF alone (C = number of classes of the first config, probabilities made from the
toy masks: 0.6 on the true class, the rest spread evenly; 10 iterations) over every image, serially in
the calling process and in pools of 1..``--max-workers`` processes; speed-up = serial time / pool time.

Ranks (``--nproc 1 2``): instead of the above, ``tools/infer.py --launcher pytorch`` under ``torchrun
--standalone --nproc-per-node N`` (a subprocess per N, ``--workers 0``: decoding in each rank), each rank with
``cpu_count // N`` torch threads on a CPU (the same cores shared out) or one GPU each; images/s = images / the
slowest rank's loop time (``summary.json``), speed-up = images/s at N / images/s at 1, against the ideal N.

Usage::

    python bench/bench_inference.py --num 8 --threads 2
    python bench/bench_inference.py --device cuda --num 64 --batch-size 4
    python bench/bench_inference.py --nproc 1 2 --num 16 --modes single ms+flip
    python bench/bench_inference.py --case coco --num 8 --rows loop
    python bench/bench_inference.py --rows "loop alone" --write-threads 0 2 --num 48 --repeats 3
    python bench/bench_inference.py --rows "loop alone" --modes single --outputs gallery --num 48
    python bench/bench_inference.py --case coco --rows loop --modes ms+flip+crf --memory --num 16 --batch-size 16
    python bench/bench_inference.py --device cuda --rows loop --modes single --num 128 --batch-size 16 --profile 15
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import json
import math
import os
import platform
import pstats
import shlex
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import cv2
import numpy as np
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from wsss.config import Config, CrfConfig, load_config
from wsss.data.classes import load_classes
from wsss.data.toy.render import TOY_CLASSES, generate_sample
from wsss.data.transforms import backbone_mean_std
from wsss.engine.checkpoint import save_checkpoint
from wsss.inference import crf as crf_module
from wsss.inference.crf import CrfPool, crf_labels
from wsss.inference.folder.loop import InferenceLoop
from wsss.inference.folder.runner import InferenceOptions, run_inference
from wsss.inference.predictor import Segmenter
from wsss.models import build_model
from wsss.models.tta import tta_forward
from wsss.utils.fileio import save_image
from wsss.utils.tensors import model_precision

CASES = {"voc": ((500, 375), ["configs/voc_centered.py", "configs/toy_centered.py"]),
         "coco": ((640, 480), ["configs/coco_centered.py"])}
ROWS = ("loop", "loop alone", "model alone")
OUTPUTS = ("overlay", "cams", "logits", "gallery")
COCO_CLASSES = 81
MODES = {
    "single": dict(scales=(1.0,), flip=False, crf=False),
    "ms+flip": dict(scales=(1.0, 1.25, 1.5), flip=True, crf=False),
    "ms+flip+crf": dict(scales=(1.0, 1.25, 1.5), flip=True, crf=True),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", default="voc", choices=list(CASES), help="image size and configs (voc: 500x375)")
    parser.add_argument("--configs", nargs="+", help="default: the case's")
    parser.add_argument("--num", type=int, default=8, help="images")
    parser.add_argument("--size", type=int, nargs=2, metavar=("W", "H"), help="default: the case's")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS),
                        help="the loop; the loop with a free model; the model alone")  # fmt: skip
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--crf-workers", type=int, default=2, help="CRF processes in the ms+flip+crf mode")
    parser.add_argument("--max-workers", type=int, default=2, help="largest CRF pool in the pool benchmark")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--mask-classes", choices=("present", "all"), help="infer.mask_classes (default: the config's)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), help="infer.dtype (default: the config's)")
    parser.add_argument("--outputs", nargs="+", default=[], choices=OUTPUTS,
                        help="more outputs per image, as tools/infer.py's flags (the gallery: --gallery)")
    parser.add_argument("--write-threads", type=int, nargs="+", default=[InferenceOptions.write_threads],
                        help="the loop rows at each count of writing threads (tools/infer.py --write-threads)")
    parser.add_argument("--nproc", type=int, nargs="+", help="time tools/infer.py under torchrun at these rank counts")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="each loop row once more, profiled: the N functions of the loop's thread with the most "
                             "own CPU time (on CUDA also the GPU's busy time)")  # fmt: skip
    parser.add_argument("--memory", action="store_true",
                        help="each mode's peak memory (CUDA: allocated on the device; CPU: its stand-in)")  # fmt: skip
    args = parser.parse_args(argv)
    size, configs = CASES[args.case]
    args.size = tuple(args.size or size)
    args.configs = args.configs or configs
    return args


def make_images(folder: Path, num: int, size: tuple[int, int], num_classes: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Write ``num`` toy scenes resized to ``size`` (W, H); return (image, CRF probabilities) pairs."""
    pairs = []
    for i in range(num):
        sample = generate_sample(np.random.default_rng((1234, i)))
        image = cv2.resize(sample.image, size, interpolation=cv2.INTER_LINEAR)
        mask = cv2.resize(sample.mask, size, interpolation=cv2.INTER_NEAREST)
        save_image(folder / f"img_{i:04d}.jpg", image, quality=90)
        mask = np.where(mask == 255, 0, mask) % num_classes
        probs = np.full((num_classes, *mask.shape), 0.4 / (num_classes - 1), dtype=np.float32)
        np.put_along_axis(probs, mask[None].astype(np.int64), 0.6, axis=0)
        pairs.append((image, probs))
    return pairs


def config_classes(cfg: Config) -> list[str]:
    """The config's class list; a class file missing here means the toy's (the toy dataset not generated), or COCO's
    81 (background and 80 numbered stand-ins: COCO's names come from its annotations, tools/convert_coco.py)."""
    if isinstance(cfg.data.classes, list):
        return load_classes(cfg.data.classes)
    path = Path(cfg.data.root) / cfg.data.classes
    if path.is_file():
        return load_classes(path)
    if "coco" in cfg.data.root:
        return ["background", *(f"coco_{k}" for k in range(1, COCO_CLASSES))]
    return list(TOY_CLASSES)


class FreeModel(torch.nn.Module):
    """A model that costs nothing: the wrapped model's outputs for each input shape, computed at the first call with
    that shape (in ``outputs``, shared by the free models of one :func:`free_models` block) and then returned as
    they are (the loop never writes into them)."""

    def __init__(self, model: torch.nn.Module, outputs: dict) -> None:
        super().__init__()
        self.model = model
        self.stride = model.stride
        self.classifier = model.classifier
        self.outputs = outputs

    def forward(self, x: torch.Tensor):
        if tuple(x.shape) not in self.outputs:
            self.outputs[tuple(x.shape)] = self.model(x)
        return self.outputs[tuple(x.shape)]


@contextmanager
def free_models():
    """Every :class:`~wsss.inference.predictor.Segmenter` made inside runs a :class:`FreeModel`; they share their
    outputs (one checkpoint per block)."""
    original = Segmenter.__init__
    outputs: dict = {}

    def init(self, model, *args, **kwargs):
        original(self, FreeModel(model, outputs), *args, **kwargs)

    Segmenter.__init__ = init
    try:
        yield
    finally:
        Segmenter.__init__ = original


def sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def time_loop(
    ckpt: Path, images: Path, out: Path, mode: str, args: argparse.Namespace, repeats: int, write_threads: int
) -> tuple[float, float]:
    """Best wall time of ``run_inference`` over ``repeats`` runs (the loop's own clock, as tools/infer.py's), and the
    CPU time of the loop's own thread in that run (:class:`~wsss.inference.folder.loop.InferenceLoop`'s ``run``:
    without the decoding processes, the writing threads and torch's other threads), the host's serial share."""
    best, best_cpu = float("inf"), float("nan")
    original = InferenceLoop.run
    spent = []

    def timed_run(self, todo):
        tic = time.thread_time()
        try:
            return original(self, todo)
        finally:
            spent.append(time.thread_time() - tic)

    InferenceLoop.run = timed_run
    try:
        for _ in range(repeats):
            summary = run_inference(ckpt, images, out, options=loop_options(mode, args, write_threads),
                                    device=args.device)  # fmt: skip
            assert summary.done == args.num and not summary.skipped, summary.format()
            if summary.seconds < best:
                best, best_cpu = summary.seconds, spent[-1]
    finally:
        InferenceLoop.run = original
    return best, best_cpu


def profile_loop(
    ckpt: Path, images: Path, out: Path, mode: str, args: argparse.Namespace, write_threads: int, label: str
) -> None:
    """``--profile``: one more run of ``mode``'s loop, its own thread under cProfile on that thread's CPU clock, and
    the ``--profile`` functions with the most own CPU time, per image; on CUDA also the GPU's kernels summed over the
    run (``torch.profiler``), against its wall time."""
    cuda = torch.device(args.device).type == "cuda"
    profiler = cProfile.Profile(time.thread_time)
    original = InferenceLoop.run

    def profiled_run(self, todo):
        profiler.enable()
        try:
            return original(self, todo)
        finally:
            profiler.disable()

    InferenceLoop.run = profiled_run
    try:
        with profile(activities=[ProfilerActivity.CUDA]) if cuda else nullcontext() as prof:
            summary = run_inference(ckpt, images, out, options=loop_options(mode, args, write_threads),
                                    device=args.device)  # fmt: skip
    finally:
        InferenceLoop.run = original
    assert summary.done == args.num and not summary.skipped, summary.format()
    per_image = 1e3 / args.num
    stats = pstats.Stats(profiler).stats  # {(file, line, name): (primitive calls, calls, own, cumulative, callers)}
    rows = sorted(((function_name(*func), calls, own) for func, (_, calls, own, _, _) in stats.items()),
                  key=lambda row: -row[2])  # fmt: skip
    spent = sum(own for _, _, own in rows)
    gpu = ""
    if cuda:
        busy = sum(e.self_device_time_total for e in prof.key_averages() if e.device_type == DeviceType.CUDA) / 1e6
        gpu = f"; the GPU's kernels {busy * per_image:.2f} ms per image, {busy / summary.seconds:.0%} of the wall"
    print(f"\n{label}, profiled: the loop's thread {spent * per_image:.2f} CPU ms per image in all, the wall "
          f"{summary.seconds * per_image:.2f} ms per image{gpu}")  # fmt: skip
    print("| function | calls per image | own CPU ms per image | share |\n|---|---:|---:|---:|")
    for name, calls, own in rows[: args.profile]:
        print(f"| `{name}` | {calls / args.num:.2f} | {own * per_image:.3f} | {own / spent:.0%} |")


def function_name(file: str, line: int, name: str) -> str:
    """A cProfile entry's function: a built-in's name as cProfile gives it, else ``file.py:line(name)``."""
    return name if file == "~" else f"{Path(file).name}:{line}({name})"


def infer_options(args: argparse.Namespace) -> dict[str, str]:
    """The ``infer.*`` options ``--mask-classes`` and ``--dtype`` give."""
    return {k: v for k, v in (("infer.mask_classes", args.mask_classes), ("infer.dtype", args.dtype)) if v}


def loop_options(mode: str, args: argparse.Namespace, write_threads: int, **more) -> InferenceOptions:
    """The loop's options for ``mode`` (``more`` overrides)."""
    return InferenceOptions(**{**MODES[mode], "batch_size": args.batch_size, "overwrite": True,
                               "crf_workers": args.crf_workers, "write_threads": write_threads, "progress": False,
                               "cfg_options": infer_options(args), **dict.fromkeys(args.outputs, True),
                               **more})  # fmt: skip


def peak_allocated(events) -> int:
    """The most bytes held at once, from the allocator's ``[memory]`` events of a ``torch.profiler`` run (each a
    signed size; the sum from the profile's start)."""
    held = peak = 0
    for _, size in sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]"):
        held += size
        peak = max(peak, held)
    return peak


def peak_memory(ckpt: Path, images: Path, out: Path, mode: str, args: argparse.Namespace) -> int:
    """Bytes: the most the loop allocated at once in one more run of ``mode`` (the module docstring, ``--memory``)."""
    cuda = torch.device(args.device).type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        options = loop_options(mode, args, InferenceOptions.write_threads)
    else:  # the CRF here, its runs as a GPU's; PyTorch's products (Triton's kernels would run in the interpreter)
        infer = {"infer.crf.kernel": "torch", **infer_options(args)}
        options = loop_options(mode, args, InferenceOptions.write_threads, crf_workers=0, cfg_options=infer)
    cpu_runs = crf_module.CPU_RUN_PIXELS
    crf_module.CPU_RUN_PIXELS = None
    try:
        with nullcontext() if cuda else profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            summary = run_inference(ckpt, images, out, options=options, device=args.device)
    finally:
        crf_module.CPU_RUN_PIXELS = cpu_runs
    assert summary.done == args.num and not summary.skipped, summary.format()
    if cuda:
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    return peak_allocated(prof.profiler.kineto_results.events())


def time_model(model: torch.nn.Module, mode: str, args: argparse.Namespace) -> float:
    """Best wall time of the mode's TTA forward passes over ``--num`` images, in batches already on the device."""
    w, h = args.size
    x = torch.randn(args.batch_size, 3, h, w, device=args.device)
    settings = MODES[mode]
    batches = -(-args.num // args.batch_size)
    best = float("inf")
    with torch.no_grad():
        tta_forward(model, x, settings["scales"], settings["flip"])  # warm-up (kernels, allocator)
        for _ in range(args.repeats):
            sync(args.device)
            tic = time.perf_counter()
            for _ in range(batches):
                tta_forward(model, x, settings["scales"], settings["flip"])
            sync(args.device)
            best = min(best, time.perf_counter() - tic)
    return best * args.num / (batches * args.batch_size)


def bench_config(
    config: str, args: argparse.Namespace, images: Path, work: Path
) -> tuple[list[tuple[str, str, float, float]], list[tuple[str, int]]]:
    """(row, mode, seconds for ``--num`` images, the loop thread's CPU seconds or NaN) of each ``--rows`` x
    ``--modes``; and with ``--memory`` (mode, peak bytes) of each mode."""
    cfg = load_config(config, {"model.pretrained": "", **infer_options(args)})
    classes = config_classes(cfg)
    model = build_model(cfg.model, num_classes=len(classes))
    mean, std = backbone_mean_std(cfg.model.backbone)
    ckpt = work / f"{Path(config).stem}.pth"
    save_checkpoint(ckpt, model, cfg, classes, mean, std, step=0)
    model = model.to(args.device).eval()
    rows, memory = [], []
    for mode in args.modes:
        out = work / f"out_{Path(config).stem}_{mode}"
        for row in args.rows:
            for threads in args.write_threads if row != "model alone" else [0]:
                several = row != "model alone" and len(args.write_threads) > 1
                name = f"{row}, {threads} writing threads" if several else row
                if row == "loop":
                    seconds, cpu = time_loop(ckpt, images, out, mode, args, args.repeats, threads)
                    if args.profile:
                        profile_loop(ckpt, images, out, mode, args, threads, f"{Path(config).name} {mode} {name}")
                elif row == "loop alone":
                    with free_models():
                        time_loop(ckpt, images, out, mode, args, 1, threads)  # computes the free model's outputs
                        seconds, cpu = time_loop(ckpt, images, out, mode, args, args.repeats, threads)
                        if args.profile:
                            profile_loop(ckpt, images, out, mode, args, threads, f"{Path(config).name} {mode} {name}")
                else:
                    with model_precision(cfg.infer.fp32_precision, cfg.infer.dtype, args.device):  # as the Segmenter
                        seconds, cpu = time_model(model, mode, args), float("nan")
                rows.append((name, mode, seconds, cpu))
                rate = f"{args.num / seconds:.3f} images/s ({seconds:.2f} s)"
                print(f"  {Path(config).name} {mode} {name}: {rate}", flush=True)
        if args.memory:
            memory.append((mode, peak_memory(ckpt, images, out, mode, args)))
            print(f"  {Path(config).name} {mode} peak memory: {memory[-1][1] / 2**20:.0f} MiB", flush=True)
    return rows, memory


def bench_ranks(config: str, args: argparse.Namespace, images: Path, work: Path) -> list[tuple[str, int, float]]:
    """(mode, ranks, images/s) of ``tools/infer.py`` under torchrun for each ``--nproc`` count (best of repeats)."""
    cfg = load_config(config, {"model.pretrained": ""})
    classes = config_classes(cfg)
    ckpt = work / f"{Path(config).stem}.pth"
    mean, std = backbone_mean_std(cfg.model.backbone)
    save_checkpoint(ckpt, build_model(cfg.model, num_classes=len(classes)), cfg, classes, mean, std, step=0)
    repo = Path(__file__).resolve().parents[1]
    rows = []
    for mode in args.modes:
        settings = MODES[mode]
        flags = ["--scales", *map(str, settings["scales"]), "--flip" if settings["flip"] else "--no-flip"]
        flags += ["--crf", "--crf-workers", str(args.crf_workers)] if settings["crf"] else []
        for ranks in args.nproc:
            threads = max(1, (os.cpu_count() or 1) // ranks) if args.device == "cpu" else 1
            out = work / f"ranks_{Path(config).stem}_{mode}_{ranks}"
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
                   "tools/infer.py", str(ckpt), str(images), str(out), *flags, "--launcher", "pytorch", "--workers",
                   "0", "--no-progress", "--overwrite", "--device", args.device, "--batch-size",
                   str(args.batch_size), "--threads", str(threads)]  # fmt: skip
            best = 0.0
            for _ in range(args.repeats):
                env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
                proc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True)
                assert proc.returncode == 0, proc.stderr[-2000:]
                summary = json.loads((out / "summary.json").read_text())
                assert summary["done"] == args.num, summary
                best = max(best, summary["images_per_s"])
            rows.append((mode, ranks, best))
            print(f"  {Path(config).name} {mode} {ranks} rank(s) x {threads} threads: {best:.3f} images/s", flush=True)
    return rows


def bench_pool(pairs: list[tuple[np.ndarray, np.ndarray]], max_workers: int) -> list[tuple[str, float]]:
    """The pydensecrf backend serially and in pools (the torch backend: bench/bench_crf.py)."""
    cfg = CrfConfig(backend="pydensecrf")
    tic = time.perf_counter()
    serial = [crf_labels(image, probs, cfg) for image, probs in pairs]
    rows = [("serial (in process)", time.perf_counter() - tic)]
    for workers in range(1, max_workers + 1):
        with CrfPool(cfg, workers=workers) as pool:  # workers start here, outside the timing
            tic = time.perf_counter()
            labels = [f.result() for f in [pool.submit(image, probs) for image, probs in pairs]]
            rows.append((f"pool, {workers} worker{'s' if workers > 1 else ''}", time.perf_counter() - tic))
        assert all(np.array_equal(a, b) for a, b in zip(serial, labels, strict=True))
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"command: python bench/bench_inference.py {shlex.join(sys.argv[1:] if argv is None else argv)}")
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"{torch.get_num_threads()} torch threads, device {args.device}, load average {os.getloadavg()[0]:.1f}"
    )
    with tempfile.TemporaryDirectory(prefix="bench_inference_") as tmp:
        tmp = Path(tmp)
        images = tmp / "images"
        num_classes = len(config_classes(load_config(args.configs[0], {"model.pretrained": ""})))
        pairs = make_images(images, args.num, tuple(args.size), num_classes)
        print(f"{args.num} images {args.size[0]}x{args.size[1]}, batch size {args.batch_size}")
        if args.nproc:
            print("\n| config | mode | ranks | images/s | speed-up (ideal) |\n|---|---|---:|---:|---:|")
            for config in args.configs:
                rows = bench_ranks(config, args, images, tmp)
                base = {mode: ips for mode, ranks, ips in rows if ranks == args.nproc[0]}
                for mode, ranks, ips in rows:
                    print(f"| {config} | {mode} | {ranks} | {ips:.3f} | {ips / base[mode]:.2f}x "
                          f"({ranks / args.nproc[0]:.0f}x) |")  # fmt: skip
            print(f"load average after: {os.getloadavg()[0]:.1f}")
            return 0
        table, memory = [], []
        for config in args.configs:
            rows, peaks = bench_config(config, args, images, tmp)
            table += [(config, *row) for row in rows]
            memory += [(config, *peak) for peak in peaks]
        print("\n| config | mode | what | images/s | ms / image | loop thread CPU ms / image |")
        print("|---|---|---|---:|---:|---:|")
        for config, row, mode, seconds, cpu in table:
            thread = "-" if math.isnan(cpu) else f"{cpu / args.num * 1000:.1f}"
            rate = f"{args.num / seconds:.3f} | {seconds / args.num * 1000:.1f}"
            print(f"| {config} | {mode} | {row} | {rate} | {thread} |")
        if memory:
            what = "allocated on the device" if torch.device(args.device).type == "cuda" else "the CPU's stand-in"
            print(f"\n| config | mode | batch size | peak MiB ({what}) |\n|---|---|---:|---:|")
            for config, mode, peak in memory:
                print(f"| {config} | {mode} | {args.batch_size} | {peak / 2**20:.0f} |")
        if args.max_workers < 1 or importlib.util.find_spec("pydensecrf") is None:
            return 0
        pool_rows = bench_pool(pairs, args.max_workers)
        print(f"\nCRF alone, {args.num} images, C = {num_classes}, load average {os.getloadavg()[0]:.1f}")
        print("| CRF | s | images/s | speed-up |\n|---|---:|---:|---:|")
        for name, seconds in pool_rows:
            print(f"| {name} | {seconds:.2f} | {args.num / seconds:.3f} | {pool_rows[0][1] / seconds:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
