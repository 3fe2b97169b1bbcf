"""How far the torch dense CRF is from pydensecrf2: max abs gap of the marginals and argmax agreement, per case.

    python bench/crf_parity.py [--checkpoint work_dirs/toy_centered/iter_600.pth --toy-root data/toy_voc]

Cases: the toy val images with a checkpoint's probabilities (every class, one scale), the five scikit-image
photographs at full size with 21 and 81 classes of model-like probabilities, random per-pixel probabilities on random
colours (2 and 21 classes), sizes from 1 x 1 to 1000 x 1000; each with ``infer.crf.reference_padding`` on (the
default) and off. The numbers of docs/reference.md row 19.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from wsss.config import CrfConfig
from wsss.inference.crf import dense_crf


def reference(image: np.ndarray, probs: np.ndarray, cfg: CrfConfig) -> np.ndarray:
    cfg = dataclasses.replace(cfg, backend="pydensecrf")
    return dense_crf(image, probs, cfg)


def smooth_probs(shape: tuple[int, int], classes: int, seed: int) -> np.ndarray:
    g = torch.Generator().manual_seed(seed)
    coarse = torch.randn(1, classes, shape[0] // 16 + 1, shape[1] // 16 + 1, generator=g) * 3
    return F.interpolate(coarse, size=shape, mode="bilinear", align_corners=False)[0].softmax(0).numpy()


def cases(checkpoint: Path | None, toy_root: Path | None):
    """(name, image, probs) triples."""
    if checkpoint is not None:
        from wsss.data.voc import read_split
        from wsss.inference.predictor import Segmenter
        from wsss.utils.fileio import read_image

        segmenter = Segmenter.from_checkpoint(checkpoint)
        every = torch.ones(len(segmenter.classes), dtype=torch.bool)
        for name in read_split(toy_root / "ImageSets" / "Segmentation" / "val.txt")[:20]:
            raw = read_image(toy_root / "JPEGImages" / f"{name}.jpg")
            yield f"toy val {name}", raw, segmenter.run_batch([raw], (1.0,), False).probabilities(0, every)
    import skimage.data as data

    photos = {n: getattr(data, n)() for n in ("astronaut", "chelsea", "coffee", "rocket")}
    photos["motorcycle_left"] = data.stereo_motorcycle()[0]
    for classes in (21, 81):
        for k, (name, photo) in enumerate(photos.items()):
            photo = np.ascontiguousarray(photo[..., :3])
            yield f"{name} {photo.shape[1]}x{photo.shape[0]}, {classes} classes", photo, smooth_probs(
                photo.shape[:2], classes, k)
    rng = np.random.default_rng(0)
    for size in ((1, 1), (3, 7), (53, 55), (375, 500), (1000, 1000)):
        for classes in (2, 21):
            if size == (1000, 1000) and classes == 21:
                continue
            image = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
            probs = rng.dirichlet(np.ones(classes), size=size).transpose(2, 0, 1).astype(np.float32)
            yield f"random colours {size[1]}x{size[0]}, {classes} classes", image, probs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, help="a toy checkpoint (make demo) for the toy val case")
    parser.add_argument("--toy-root", type=Path, default=Path("data/toy_voc"))
    args = parser.parse_args(argv)
    print("| case | max abs gap | argmax agreement | max abs gap, reference_padding=False |")
    print("|---|---|---|---|")
    toy = {"gap": 0.0, "agree": [], "off": 0.0}
    for name, image, probs in cases(args.checkpoint, args.toy_root):
        want = reference(image, probs, CrfConfig())
        got = dense_crf(image, probs, CrfConfig())
        off = dense_crf(image, probs, CrfConfig(reference_padding=False))
        gap, agree = float(np.abs(got - want).max()), float((got.argmax(0) == want.argmax(0)).mean())
        off_gap = float(np.abs(off - want).max())
        if name.startswith("toy val"):  # one row for the toy set
            toy = {"gap": max(toy["gap"], gap), "agree": [*toy["agree"], agree], "off": max(toy["off"], off_gap)}
            continue
        print(f"| {name} | {gap:.1e} | {100 * agree:.4f} % | {off_gap:.1e} |")
    if toy["agree"]:
        print(f"| toy val, {len(toy['agree'])} images, {args.checkpoint.name} | {toy['gap']:.1e} | "
              f"{100 * min(toy['agree']):.4f} % (lowest) | {toy['off']:.1e} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
