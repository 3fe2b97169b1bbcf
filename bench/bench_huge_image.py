"""Peak memory and wall time of ``tools/infer.py`` on one huge image (the issue-22 repro: a 12000 x 12000 PNG of a
few hundred KB, under PIL's bomb limit), against the imports alone, in the same run.

    python bench/bench_huge_image.py [--checkpoint work_dirs/toy_centered/iter_600.pth] [--size 12000]
        [--before REV] [-- infer options ...]

The image (a flat colour with a disc) is written to a temporary folder; each tree's ``tools/infer.py CHECKPOINT
IMAGE OUT --scales 1 --no-flip --workers 0 --device cpu`` runs as a fresh subprocess and its peak resident memory
(``ru_maxrss`` from ``os.wait4``) and wall time are reported, with the peer ``python -c "import torch,
wsss.inference.folder.runner"`` (what every run holds before it reads a pixel) and the image's own uint8 bytes. The
model
sees the image at ``infer.max_size`` (the checkpoint's, 1024 by default) unless ``--max-size`` is passed through.
``--before REV`` also runs the tree of git revision REV (``bench_help.unpack_revision``), to compare.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_help import ROOT, tree_env, unpack_revision
from PIL import Image, ImageDraw


def peak_rss(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[int, float]:
    """(peak resident bytes, wall seconds) of one run of ``cmd``; a failing command stops the benchmark."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    err = proc.stderr.read().decode(errors="replace")
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd[1:])} in {cwd} exited {proc.returncode}: {err.strip()[-500:]}")
    return usage.ru_maxrss * 1024, seconds  # kilobytes on Linux


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, default=ROOT / "work_dirs/toy_centered/iter_600.pth")
    parser.add_argument("--size", type=int, default=12000, help="side of the square test image")
    parser.add_argument("--before", help="also run the tree of this git revision")
    parser.add_argument("infer_options", nargs="*", help="more tools/infer.py options (after --)")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        image = Image.new("RGB", (args.size, args.size), (40, 90, 160))
        ImageDraw.Draw(image).ellipse([args.size // 4, args.size // 4, 3 * args.size // 4, 3 * args.size // 4],
                                      fill=(200, 30, 30))  # fmt: skip
        (tmp / "in").mkdir()
        image.save(tmp / "in" / "huge.png")
        del image
        trees = {"now": ROOT}
        if args.before:
            commit = unpack_revision(args.before, tmp / "before")
            trees = {f"before ({commit})": tmp / "before", **trees}
        size_mb = (tmp / "in" / "huge.png").stat().st_size / 2**20
        print(f"{args.size} x {args.size} PNG ({size_mb:.2f} MiB on disk, {3 * args.size**2 / 2**30:.2f} GiB of "
              f"uint8 RGB); checkpoint {args.checkpoint}; options {' '.join(args.infer_options) or '-'}\n")  # fmt: skip
        print("| tree | peak RSS (GiB) | imports alone (GiB) | wall (s) |")
        print("|---|---|---|---|")
        for name, tree in trees.items():
            env = tree_env(tree)
            floor, _ = peak_rss([sys.executable, "-c", "import torch, wsss.inference.folder.runner"], tree, env)
            out = tmp / f"out_{len(name)}"
            cmd = [sys.executable, "tools/infer.py", str(args.checkpoint.resolve()), str(tmp / "in"), str(out),
                   "--scales", "1", "--no-flip", "--workers", "0", "--no-progress", "--device", "cpu",
                   *args.infer_options]  # fmt: skip
            peak, seconds = peak_rss(cmd, tree, env)
            print(f"| {name} | {peak / 2**30:.2f} | {floor / 2**30:.2f} | {seconds:.1f} |", flush=True)


if __name__ == "__main__":
    main()
