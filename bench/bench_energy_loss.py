"""Forward+backward time and peak memory of the dense energy loss (``wsss.losses.DenseEnergyLoss``).

Two measurements in one process, of the blocked version (``kernel="blocked"``) and, on CUDA, of the fused
Triton kernel (``kernel="fused"``, :mod:`wsss.energy_kernel`; skipped on a CPU, where it only runs in Triton's
interpreter), and at the training setting also of the reference's permutohedral lattice (``kernel="lattice"``,
another ``W``: not compared with the brute force; on CUDA its build and products are the CRF's Triton kernels):

1. The training setting: batch ``--batch`` of ``--size`` crops, ``--classes`` channels, evaluated at
   ``--scale`` (448 at 0.5: 224x224 = 50,176 pixels per image, 2.5e9 kernel entries per image), with
   ToCo's constants (sigma_rgb 15, sigma_xy 100, weight 1e-7).
2. Against the brute-force dense evaluation (the whole N x N kernel materialised in float32, autograd
   through ``-(1/B) sum_i g_i S_i . (W S)_i`` with ToCo's gradient surrogate) at ``--compare-size``, where
   that fits: time and memory ratio, and the largest relative difference of the loss and its gradient.

One step = loss forward and ``backward()`` to the segmentation logits. Time: median over ``--repeats``
steps after ``--warmup`` untimed ones (CUDA synchronised). Peak memory of a step:
- CUDA: ``torch.cuda.max_memory_allocated`` minus the memory allocated before the step;
- CPU (Linux): peak resident set size during the step minus the resident size before it (free heap pages
  returned with ``malloc_trim`` and the peak counter reset through ``/proc/self/clear_refs`` first).

Usage::

    python bench/bench_energy_loss.py
    python bench/bench_energy_loss.py --device cuda --repeats 10
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import gc
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from _common import rss_bytes, synchronize

from wsss.config import DataConfig, LossConfig
from wsss.losses import DenseEnergyLoss


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--size", type=int, default=448)
    parser.add_argument("--scale", type=float, default=0.5)
    parser.add_argument("--classes", type=int, default=21)
    parser.add_argument("--block-size", type=int, default=None, help="tile edge (default: by device)")
    parser.add_argument("--compare-size", type=int, default=160, help="crop size of the brute-force comparison")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    return parser.parse_args(argv)


def make_inputs(batch: int, size: int, classes: int, device: torch.device) -> dict[str, torch.Tensor]:
    """Smooth synthetic images (0..255), logits, a valid box and pseudo labels with ignored pixels."""
    g = torch.Generator().manual_seed(0)
    images = F.interpolate(torch.rand(batch, 3, 8, 8, generator=g) * 255, size=(size, size), mode="bilinear")
    images = (images + 10 * torch.randn(images.shape, generator=g)).clamp(0, 255)
    logits = 3 * F.interpolate(torch.randn(batch, classes, 16, 16, generator=g), size=(size, size), mode="bilinear")
    valid = torch.zeros(batch, size, size, dtype=torch.bool)
    valid[:, : size * 7 // 8] = True
    label = logits.argmax(1)
    label[torch.rand(label.shape, generator=g) > 0.7] = 255
    label[~valid] = 255
    out = {"images": images, "logits": logits, "valid": valid, "label": label}
    return {k: v.to(device) for k, v in out.items()}


def brute_force_loss(
    images: torch.Tensor, probs: torch.Tensor, valid: torch.Tensor, label: torch.Tensor, loss: DenseEnergyLoss
) -> tuple[torch.Tensor, torch.Tensor]:
    """(value, gradient surrogate) of the same loss with the N x N kernel materialised."""
    h, w = probs.shape[-2:]
    size = (int(h * loss.scale_factor), int(w * loss.scale_factor))
    img = F.interpolate(images, size=size, mode="nearest")
    s = F.interpolate(probs, size=size, mode="bilinear", align_corners=False)
    roi = F.interpolate(valid[:, None].float(), size=size, mode="nearest")[:, 0]
    unlabelled = F.interpolate(label[:, None].float(), size=size, mode="nearest")[:, 0] == loss.ignore_index
    gate = torch.where(unlabelled, torch.ones_like(roi), (roi - s.detach().amax(1)).clamp(min=0)) * roi
    ys, xs = torch.meshgrid(
        torch.arange(size[0], device=s.device), torch.arange(size[1], device=s.device), indexing="ij"
    )
    sxy = loss.sigma_xy * loss.scale_factor
    xy = torch.stack([xs / sxy, ys / sxy])[None].expand(len(img), 2, *size)
    feats = torch.cat([xy, img / loss.sigma_rgb], 1).flatten(2).transpose(1, 2)  # (B, N, 5)
    kernel = torch.exp(-0.5 * torch.cdist(feats, feats).square())  # (B, N, N)
    s = (s * roi[:, None]).flatten(2).transpose(1, 2)  # (B, N, C)
    ws = kernel @ s
    g = gate.flatten(1)[:, :, None]
    value = -(g * s * ws).sum() / len(img)
    surrogate = -2 * (g * s * ws.detach()).sum() / len(img)
    return loss.weight * value, loss.weight * surrogate


def measure(step: Callable[[], None], device: torch.device, repeats: int, warmup: int) -> tuple[list[float], int]:
    """Step times (s) and the peak memory (bytes) of the first timed step."""
    for _ in range(warmup):
        step()
    times, peak = [], 0
    for r in range(repeats):
        gc.collect()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
        else:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            base = rss_bytes("VmRSS")
        start = time.perf_counter()
        step()
        synchronize(device)
        times.append(time.perf_counter() - start)
        if r == 0:
            peak = (torch.cuda.max_memory_allocated(device) if device.type == "cuda" else rss_bytes("VmHWM")) - base
        print(f"  step {r}: {times[-1]:.3f} s", file=sys.stderr)
    return times, peak


def ours_step(inputs: dict[str, torch.Tensor], loss: DenseEnergyLoss) -> Callable[[], None]:
    def step() -> None:
        logits = inputs["logits"].clone().requires_grad_(True)
        loss(inputs["images"], logits.softmax(1), inputs["valid"], inputs["label"]).backward()

    return step


def brute_step(inputs: dict[str, torch.Tensor], loss: DenseEnergyLoss) -> Callable[[], None]:
    def step() -> None:
        logits = inputs["logits"].clone().requires_grad_(True)
        _, surrogate = brute_force_loss(inputs["images"], logits.softmax(1), inputs["valid"], inputs["label"], loss)
        surrogate.backward()

    return step


def agreement(inputs: dict[str, torch.Tensor], loss: DenseEnergyLoss) -> tuple[float, float]:
    """Largest relative difference of the loss value and of the logit gradient, ours vs brute force."""
    a = inputs["logits"].clone().requires_grad_(True)
    ours = loss(inputs["images"], a.softmax(1), inputs["valid"], inputs["label"])
    ours.backward()
    b = inputs["logits"].clone().requires_grad_(True)
    value, surrogate = brute_force_loss(inputs["images"], b.softmax(1), inputs["valid"], inputs["label"], loss)
    surrogate.backward()
    value_err = abs(ours.item() - value.item()) / abs(value.item())
    grad_err = ((a.grad - b.grad).abs().max() / b.grad.abs().max()).item()
    return value_err, grad_err


def make_loss(scale: float, block_size: int | None, kernel: str) -> DenseEnergyLoss:
    """The configured loss at ``scale`` with the given ``W S`` implementation."""
    loss_cfg = dataclasses.replace(LossConfig(), reg_scale=scale, reg_kernel=kernel)
    loss = DenseEnergyLoss.from_config(loss_cfg, DataConfig().ignore_index)
    loss.block_size = block_size
    return loss


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    loss = make_loss(args.scale, args.block_size, "blocked")
    fused = make_loss(args.scale, None, "fused") if device.type == "cuda" else None
    if fused is None:
        print("fused Triton kernel: skipped (CUDA only; a CPU runs it only in Triton's interpreter)", file=sys.stderr)
    small_repeats, small_warmup = max(args.repeats, 3), max(args.warmup, 1)

    print(f"training setting: batch {args.batch}, {args.size}x{args.size}", file=sys.stderr)
    full = make_inputs(args.batch, args.size, args.classes, device)
    t_full, m_full = measure(ours_step(full, loss), device, args.repeats, args.warmup)
    lattice = make_loss(args.scale, None, "lattice")
    t_lattice, m_lattice = measure(ours_step(full, lattice), device, max(args.repeats, 3), max(args.warmup, 1))
    if fused is not None:  # at least one warm-up step: the first call compiles the kernel
        t_fused_full, m_fused_full = measure(ours_step(full, fused), device, args.repeats, max(args.warmup, 1))

    print(f"comparison: batch {args.batch}, {args.compare_size}x{args.compare_size}", file=sys.stderr)
    small = make_inputs(args.batch, args.compare_size, args.classes, device)
    value_err, grad_err = agreement(small, loss)
    t_ours, m_ours = measure(ours_step(small, loss), device, small_repeats, small_warmup)
    t_brute, m_brute = measure(brute_step(small, loss), device, small_repeats, small_warmup)
    if fused is not None:
        fused_value_err, fused_grad_err = agreement(small, fused)
        t_fused, m_fused = measure(ours_step(small, fused), device, small_repeats, small_warmup)

    command = "python bench/bench_energy_loss.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    n_full = int(args.size * args.scale) ** 2
    n_small = int(args.compare_size * args.scale) ** 2
    print(f"`{command}`\n")
    print(
        f"{device}, torch {torch.__version__}, {torch.get_num_threads()} threads ({platform.machine()}); "
        f"batch {args.batch}, {args.classes} classes, scale {args.scale}; median of the timed steps\n"
    )
    print("| crop | pixels / image at scale | method | fwd+bwd time (s) | peak memory (MiB) |")
    print("|---|---|---|---|---|")
    print(f"| {args.size} | {n_full} | blocked exact (ours) | {statistics.median(t_full):.3f} | {m_full / 2**20:.0f} |")
    t_l = statistics.median(t_lattice)
    print(f"| {args.size} | {n_full} | permutohedral lattice (the reference's) | {t_l:.3f} | {m_lattice / 2**20:.0f} |")
    t_o, t_b = statistics.median(t_ours), statistics.median(t_brute)
    print(f"| {args.compare_size} | {n_small} | blocked exact (ours) | {t_o:.3f} | {m_ours / 2**20:.0f} |")
    print(f"| {args.compare_size} | {n_small} | brute-force N x N | {t_b:.3f} | {m_brute / 2**20:.0f} |")
    if fused is not None:
        t_ff, t_f = statistics.median(t_fused_full), statistics.median(t_fused)
        print(f"| {args.size} | {n_full} | fused Triton kernel (ours) | {t_ff:.3f} | {m_fused_full / 2**20:.0f} |")
        print(f"| {args.compare_size} | {n_small} | fused Triton kernel (ours) | {t_f:.3f} | {m_fused / 2**20:.0f} |")
    print(
        f"\nAt {args.compare_size}: time ours / brute force = {t_o / t_b:.3f}, memory ours / brute force = "
        f"{m_ours / max(m_brute, 1):.3f}; max relative difference: loss {value_err:.2e}, "
        f"gradient {grad_err:.2e}"
    )
    print(f"\nAt {args.size}: lattice / blocked time = {t_l / statistics.median(t_full):.4f}")
    if fused is None:
        print("\nFused Triton kernel: not timed (CUDA only).")
    else:
        print(
            f"\nFused / blocked time: {t_ff / statistics.median(t_full):.3f} at {args.size} (lattice / fused "
            f"{t_l / t_ff:.3f}), {t_f / t_o:.3f} at "
            f"{args.compare_size}; fused vs brute force at {args.compare_size}, max relative difference: loss "
            f"{fused_value_err:.2e}, gradient {fused_grad_err:.2e}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
