"""What ``par.kernel`` changes: PAR's Triton kernels against its PyTorch path on photographs (docs/reference.md).

    python bench/par_kernel_effect.py [--size 112] [--channels 6]

scikit-image's photographs (astronaut, chelsea, coffee, rocket) resized to ``--size`` squared, ``--channels`` smooth
random score maps each (a 14 x 14 Gaussian field, upsampled, softmax), refined by the paper's PAR (the config's
``par.*``) both ways. On a GPU both run there; on a CPU the kernels run in Triton's interpreter (minutes at 112 px).
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import skimage.data
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():  # before the kernels are made (the first import of wsss.par_kernel)
    os.environ.setdefault("TRITON_INTERPRET", "1")

from wsss.config import ParConfig  # noqa: E402
from wsss.par import PAR  # noqa: E402

PHOTOS = ("astronaut", "chelsea", "coffee", "rocket")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=112)
    parser.add_argument("--channels", type=int, default=6)
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    size = (args.size, args.size)
    photos = [torch.from_numpy(np.ascontiguousarray(getattr(skimage.data, name)()[..., :3])) for name in PHOTOS]
    images = torch.cat([F.interpolate(p.permute(2, 0, 1)[None].float() / 255, size=size, mode="bilinear",
                                      align_corners=False) for p in photos]).to(device)  # fmt: skip
    field = torch.randn(len(PHOTOS), args.channels, 14, 14, generator=torch.Generator().manual_seed(0)) * 3
    maps = F.interpolate(field, size=size, mode="bilinear", align_corners=False).softmax(1).to(device)
    torch_par, fused_par = (PAR.from_config(ParConfig(kernel=k)).to(device) for k in ("torch", "fused"))
    want, got = torch_par(images, maps), fused_par(images, maps)
    gap = (got - want).abs()
    print(f"{len(PHOTOS)} photographs at {args.size} x {args.size}, {args.channels} maps each, on {device}:")
    print(f"refined scores: max abs {gap.max():.2g}, max relative {(gap / want.abs()).max():.2g}")
    print(f"affinities: max abs {(fused_par.affinity(images) - torch_par.affinity(images)).abs().max():.2g}")
    equal = (got.argmax(1) == want.argmax(1)).sum()
    print(f"argmax equal on {int(equal)} of {want[:, 0].numel()} pixels")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
