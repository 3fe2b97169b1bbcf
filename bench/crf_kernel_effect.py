"""What ``infer.crf.kernel`` changes: the torch CRF's Triton kernels against PyTorch's sparse products, and both
against pydensecrf, on photographs (docs/reference.md, the bullets after the table).

    python bench/crf_kernel_effect.py [--size 48 64] [--classes 21 81] [--photos 5]

bench/bench_crf.py's photographs (astronaut, chelsea, coffee, rocket, motorcycle) resized to ``--size`` with its
model-like probabilities, the default CRF constants (10 iterations). On a GPU both torch paths run there; on a CPU the
kernels run in Triton's interpreter (about a minute per photograph at 48 x 64). pydensecrf, where installed, runs on
the CPU.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import replace

import numpy as np
import torch

if not torch.cuda.is_available():  # before the kernels are made (the first import of wsss.inference.crf)
    os.environ.setdefault("TRITON_INTERPRET", "1")

from bench_crf import photographs, probabilities  # noqa: E402

from wsss.config import CrfConfig  # noqa: E402
from wsss.inference.crf import _pydensecrf, dense_crf  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, nargs=2, default=[48, 64], metavar=("H", "W"))
    parser.add_argument("--classes", type=int, nargs="+", default=[21, 81])
    parser.add_argument("--photos", type=int, default=5)
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cfg = CrfConfig()
    size = tuple(args.size)
    try:
        import pydensecrf  # noqa: F401

        reference = True
    except ImportError:
        reference = False
    print(f"{args.photos} photographs at {size[0]} x {size[1]}, {cfg.iterations} iterations, on {device}")
    print("| classes | photograph | fused vs torch: max abs | argmax equal | fused vs pydensecrf: max abs | "
          "argmax equal | torch vs pydensecrf: max abs |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|")
    for classes in args.classes:
        for k, image in enumerate(photographs(size, args.photos)):
            probs = probabilities(size, classes, k)
            tensor = torch.from_numpy(probs).to(device)
            want, got = (dense_crf(image, tensor, replace(cfg, kernel=kernel)).cpu().numpy()
                         for kernel in ("torch", "fused"))  # fmt: skip
            row = [f"{np.abs(got - want).max():.2g}", f"{(got.argmax(0) == want.argmax(0)).mean():.2%}"]
            if reference:
                ref = _pydensecrf(image, probs, cfg)
                row += [f"{np.abs(got - ref).max():.2g}", f"{(got.argmax(0) == ref.argmax(0)).mean():.2%}",
                        f"{np.abs(want - ref).max():.2g}"]  # fmt: skip
            print(f"| {classes} | {k} | " + " | ".join(row) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
