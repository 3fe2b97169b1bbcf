"""Peak memory of :func:`wsss.cam.multiscale_cam` on one batch, the batch path against ``one_image_at_a_time``.

A stand-in model (random maps at 1/16 of the input, ``--classes`` planes) on ``--batch`` random images of ``--size``
at ``--scales`` with flips; each mode runs in a fresh process of this script, which prints its peak resident memory
above what it held before the call (``VmHWM - VmRSS``, Linux) and the output's size. The default is the largest batch
the tools take on a GPU at COCO size: 16 images of 640 x 480 with 80 foreground classes.

    python bench/cam_memory.py
"""

from __future__ import annotations

import argparse
import subprocess
import sys

import torch
from _common import rss_bytes

from wsss.cam import multiscale_cam


def peak(args: argparse.Namespace) -> None:
    """One mode in this process: prints ``peak_mib output_mib``."""
    torch.manual_seed(0)
    w, h = args.size
    images = torch.randn(args.batch, 3, h, w)
    labels = torch.zeros(args.batch, args.classes)
    labels[:, :3] = 1
    cam_fn = lambda x: torch.randn(x.shape[0], args.classes, x.shape[2] // 16, x.shape[3] // 16)  # noqa: E731
    before = rss_bytes("VmRSS")
    out = multiscale_cam(cam_fn, images, labels, args.scales, one_image_at_a_time=args.mode == "alone")
    print((rss_bytes("VmHWM") - before) / 2**20, out.numel() * out.element_size() / 2**20)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--classes", type=int, default=80, help="foreground classes")
    parser.add_argument("--size", type=int, nargs=2, default=(640, 480), metavar=("W", "H"))
    parser.add_argument("--scales", type=float, nargs="+", default=(1.0, 0.5, 1.5))
    parser.add_argument("--mode", choices=("batch", "alone"), help=argparse.SUPPRESS)  # one mode, in a fresh process
    args = parser.parse_args(argv)
    if args.mode:
        peak(args)
        return 0
    print(f"multiscale_cam, {args.batch} images of {args.size[0]} x {args.size[1]}, {args.classes} classes, scales "
          f"{tuple(args.scales)} with flips\n| maps brought to full size | peak MiB | of it the output, MiB |\n"
          "|---|---:|---:|")  # fmt: skip
    for mode, name in (("batch", "the whole batch at once"), ("alone", "one image at a time")):
        command = [sys.executable, __file__, "--mode", mode, "--batch", str(args.batch), "--classes",
                   str(args.classes), "--size", *map(str, args.size), "--scales", *map(str, args.scales)]  # fmt: skip
        mib, output = map(float, subprocess.run(command, check=True, capture_output=True, text=True).stdout.split())
        print(f"| {name} | {mib:,.0f} | {output:,.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
