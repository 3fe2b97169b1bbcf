"""Forward+backward time and peak memory of the ViT backbone for every attention variant.

Every variant (fused SDPA path, and with ``--explicit`` the materialised path) is timed in one process;
the repeats are interleaved (one step of every configuration per round, the order rotating each round)
and the median is reported with two ratios to vanilla fused attention: the ratio of the medians, and the
median over rounds of the per-round ratio (paired, so robust to load that drifts between rounds on a shared
machine). Wall time and the process's CPU time (all threads; on a shared machine less affected by other
jobs than wall time, most of all with ``--threads 1``) are both reported. One step = forward of the backbone
(final tokens), ``mean(features^2)`` loss, backward, ``zero_grad(set_to_none=True)``.

Memory of one step, measured separately from the timing. Saved activations: the bytes of the distinct
tensor storages autograd keeps for the backward pass (parameters excluded; exact and device-independent).
Peak memory:
- CUDA: ``torch.cuda.max_memory_allocated`` minus the memory allocated before the step.
- CPU (Linux): the process's peak resident set size during the step minus its resident size before it.
  Before the step, free heap pages are returned to the OS (glibc ``malloc_trim``) and the kernel's peak-RSS
  counter is reset (``/proc/self/clear_refs``), so the number is the high-water mark of the memory the step
  made resident: activations, gradients and temporaries (including oneDNN scratch space).

Usage::

    python bench/bench_attention.py --batch 4 --size 448 --explicit
    python bench/bench_attention.py --device cuda --dtype bf16 --batch 4 --size 448 --explicit
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable

import torch
from _common import rss_bytes, synchronize

from wsss.config import AttentionConfig
from wsss.models import ATTENTION_VARIANTS, ViTBackbone, attention_args, build_backbone, set_fused_attention

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backbone", default="deit_small_patch16_224")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--size", type=int, default=448)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=list(DTYPES), default="fp32", help="autocast dtype (fp32: none)")
    parser.add_argument("--variants", nargs="+", default=list(ATTENTION_VARIANTS), choices=list(ATTENTION_VARIANTS))
    parser.add_argument("--explicit", action="store_true", help="also time the materialised-attention path")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds (median reported)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    return parser.parse_args(argv)


def make_step(model: ViTBackbone, x: torch.Tensor, dtype: torch.dtype) -> Callable[[], None]:
    device_type = x.device.type

    def step() -> None:
        with torch.autocast(device_type, dtype=dtype, enabled=dtype != torch.float32):
            features = model(x).features
        features.float().square().mean().backward()
        model.zero_grad(set_to_none=True)

    return step



def saved_activation_bytes(step: Callable[[], None], model: torch.nn.Module) -> int:
    """Bytes of the distinct tensor storages autograd saves for the backward pass, parameters excluded."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step()
    return sum(saved.values())


def peak_memory(step: Callable[[], None], device: torch.device) -> int:
    """Peak bytes one step adds on top of what was allocated (CUDA) or resident (CPU) before it."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        step()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - base
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak-RSS counter to the current RSS
    base = rss_bytes("VmRSS")
    step()
    return rss_bytes("VmHWM") - base


def ratios(times: dict[tuple[str, str], list[float]], config: tuple[str, str], ref: tuple[str, str]) -> str:
    """``ratio of medians / median of per-round ratios`` of ``config`` to ``ref``."""
    of_medians = statistics.median(times[config]) / statistics.median(times[ref])
    paired = statistics.median(a / b for a, b in zip(times[config], times[ref], strict=True))
    return f"{of_medians:.3f} / {paired:.3f}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = DTYPES[args.dtype]
    x = torch.randn(args.batch, 3, args.size, args.size, generator=torch.Generator().manual_seed(0)).to(device)

    models = {}
    for name in args.variants:
        torch.manual_seed(0)
        models[name] = build_backbone(args.backbone, **attention_args(AttentionConfig(name=name))).to(device).train()
    paths = ["fused", "explicit"] if args.explicit else ["fused"]
    configs = [(name, path) for path in paths for name in args.variants]

    def run(config: tuple[str, str]) -> Callable[[], None]:
        name, path = config
        set_fused_attention(models[name], path == "fused")
        return make_step(models[name], x, dtype)

    wall: dict[tuple[str, str], list[float]] = {c: [] for c in configs}
    cpu: dict[tuple[str, str], list[float]] = {c: [] for c in configs}
    for r in range(args.warmup + args.repeats):
        order = configs[r % len(configs) :] + configs[: r % len(configs)]
        for config in order:
            step = run(config)
            synchronize(device)
            start, start_cpu = time.perf_counter(), time.process_time()
            step()
            synchronize(device)
            elapsed, elapsed_cpu = time.perf_counter() - start, time.process_time() - start_cpu
            if r >= args.warmup:
                wall[config].append(elapsed)
                cpu[config].append(elapsed_cpu)
            print(
                f"round {r} {config[0]:>10s} {config[1]:>8s} {elapsed:8.3f} s, cpu {elapsed_cpu:8.3f} s",
                file=sys.stderr,
            )
    memory = {config: peak_memory(run(config), device) for config in configs}
    saved = {config: saved_activation_bytes(run(config), models[config[0]]) for config in configs}

    ref = ("vanilla", "fused") if "vanilla" in args.variants else configs[0]
    command = "python bench/bench_attention.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    tokens = (args.size // 16) ** 2 + 1
    print(f"`{command}`\n")
    print(
        f"{args.backbone}, batch {args.batch}, {args.size}x{args.size} ({tokens} tokens), {device}, "
        f"{args.dtype}, torch {torch.__version__}, {torch.get_num_threads()} threads ({platform.machine()}); "
        f"{args.repeats} timed rounds, {args.warmup} warm-up. Ratios are to vanilla fused: "
        "ratio of the medians / median of the per-round ratios.\n"
    )
    print(
        "| variant | path | wall time (s), median [min] | wall ratio | process CPU time (s), median | "
        "CPU-time ratio | peak memory (MiB) | memory ratio | saved activations (MiB) | saved ratio |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for config in configs:
        m = memory[config]
        print(
            f"| {config[0]} | {config[1]} | {statistics.median(wall[config]):.3f} [{min(wall[config]):.3f}] | "
            f"{ratios(wall, config, ref)} | {statistics.median(cpu[config]):.3f} | {ratios(cpu, config, ref)} | "
            f"{m / 2**20:.0f} | {m / memory[ref]:.3f} | {saved[config] / 2**20:.1f} | "
            f"{saved[config] / saved[ref]:.4f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
