"""What ``loss.seg_resize`` changes: the decoder's logits brought to the crop by ``F.interpolate`` or matrix products.

    python bench/seg_resize.py [--device cuda] [--config configs/voc_centered.py] [--repeats 20]

At the config's step shapes (``train.batch_size`` crops of ``data.crop_size``, the dataset's classes, the model's
stride):
1. each method's forward and gradient against both computed in float64 (``maps_to_pixels`` on float64 logits);
2. the CUDA atomics of ``F.interpolate``'s backward (``upsample_bilinear2d_backward`` adds each output pixel's
   gradient into the four logits it samples, one atomic add each, also where two of the four are the same logit),
   counted from the weights: how many in all, and the most that land on one logit (they serialise on its address);
3. the seg CE's forward + backward with each resize, timed in this process on ``--device`` (median of ``--repeats``),
   the method's ratio to ``interpolate``.
"""

from __future__ import annotations

import argparse
import sys

import torch
from _common import timed

from wsss.config import load_config
from wsss.losses import balanced_seg_ce
from wsss.models import PixelResize, build_model, maps_to_pixels


def atomic_adds(n_grid: int, n_pixels: int) -> torch.Tensor:
    """(n_grid,) adds landing on each logit of one axis in ``upsample_bilinear2d_backward``: each output pixel adds
    into its two neighbours (the lower one twice at the last input, where the upper is clamped onto it)."""
    src = ((torch.arange(n_pixels) + 0.5) * (n_grid / n_pixels) - 0.5).clamp(min=0)
    lower = src.floor().long().clamp(max=n_grid - 1)
    upper = (lower + 1).clamp(max=n_grid - 1)
    return torch.bincount(lower, minlength=n_grid) + torch.bincount(upper, minlength=n_grid)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/voc_centered.py")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    cfg = load_config(args.config, {"model.pretrained": ""})
    device = torch.device(args.device)
    b, s, c = cfg.train.batch_size, cfg.data.crop_size, len(cfg.data.classes)
    stride = build_model(cfg.model, c).stride
    grid = -(-s // stride)  # a crop that is no multiple of the stride is padded
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"{args.config}: {b} x {c} logits of {grid} x {grid} -> {s} x {s}; {name}")

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(b, c, grid, grid, generator=g, dtype=torch.float64)
    upstream = torch.randn(b, c, s, s, generator=g, dtype=torch.float64)
    exact = logits.clone().requires_grad_()
    expected = maps_to_pixels(exact, (s, s), stride)
    (expected * upstream).sum().backward()
    methods = {"interpolate": maps_to_pixels, "matmul": PixelResize()}
    print("\n| method | forward, most off float64 | gradient, most off float64 (largest entry) |")
    print("|---|---:|---:|")
    for method, to_pixels in methods.items():
        x = logits.float().to(device).requires_grad_()
        out = to_pixels(x, (s, s), stride)
        (out * upstream.float().to(device)).sum().backward()
        forward = (out.detach().double().cpu() - expected.detach()).abs().max()
        grad = (x.grad.double().cpu() - exact.grad).abs().max()
        print(f"| {method} | {forward:.2e} | {grad:.2e} ({exact.grad.abs().max():.1f}) |")

    most = int(atomic_adds(grid, s).max())
    print(f"\nF.interpolate's backward on CUDA: {4 * b * c * s * s:,} atomic adds, up to {most**2:,} on one logit "
          f"({most} per axis); the matmul's backward: two matrix products, none.")

    labels = torch.randint(0, c, (b, s, s), generator=g).to(device)
    labels[:, : s // 8] = cfg.data.ignore_index
    x = torch.randn(b, c, grid, grid, generator=g).to(device).requires_grad_()
    seconds = {}
    for method, to_pixels in methods.items():

        def seg_ce(to_pixels=to_pixels) -> None:
            x.grad = None
            balanced_seg_ce(to_pixels(x, (s, s), stride), labels, cfg.data.ignore_index).backward()

        seconds[method], _ = timed(seg_ce, args.repeats, device)
    print("\n| seg CE forward + backward, logits resized by | ms | against interpolate |")
    print("|---|---:|---:|")
    for method, t in seconds.items():
        print(f"| {method} | {t * 1e3:.2f} | {seconds['interpolate'] / t:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
