"""The training loader alone: the images/s it feeds against what the step's goal needs (issue 36).

    python bench/bench_loader.py [--config configs/voc_centered.py] [--workers 0 1 2] [--images 64 | --root DIR]
        [--batches 24] [--goal 30] [--cfg-options KEY=VALUE ...]

Writes a VOC-layout set of JPEGs at VOC's typical 500 x 375 (scikit-image's photographs, resized; a dev requirement)
into a temporary folder, or takes the dataset at `--root`, and times the batches of the loader `tools/train.py` builds
(`wsss.engine.train.training_batches`: the config's scale range, flip, crop and colour augmentation,
`train.batch_size` images a batch) with `data.num_workers` set to each of `--workers`. Nothing else runs: no model, no
device. 0 workers reads in this process (torch on one thread). Each row times the loader's uint8 crops (the step's
device normalises them, `wsss.data.transforms.PixelNormalize`) from workers started once, and, its peers in the same
process, the same with the workers started anew each epoch and the loader before both changes: float32 crops the
augmentation normalised on the host (4 bytes a value through the workers' shared memory instead of 1), workers
restarted each epoch. The ratio is the first over the last.
The table gives images/s, the iterations/s the uint8 loader feeds at the config's batch, and the workers `--goal`
iterations/s needs at the rate of one worker (with 1 in `--workers`). The first batches of each row (2 per worker, at
least 2) are not timed: the workers' start.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import albumentations as A
import cv2
import numpy as np
import torch
from bench_crf import photographs

from wsss.config import apply_options, load_config, parse_cfg_options
from wsss.data.labels import save_labels
from wsss.data.transforms import Sample, TrainAugment, backbone_mean_std
from wsss.data.voc import VOCClsDataset, config_classes
from wsss.engine import train as train_module
from wsss.engine.train import training_batches

SIZE = (375, 500)
"""VOC's most common image size (height, width)."""


def write_voc_layout(root: Path, count: int, classes: list[str], split: str) -> None:
    """``count`` JPEGs (OpenCV's default quality, 95) of the photographs at :data:`SIZE`, the split file listing
    them, and ``cls_labels.json`` giving each a foreground class (the loader reads labels, not what they say)."""
    (root / "JPEGImages").mkdir(parents=True)
    (root / "ImageSets" / "Segmentation").mkdir(parents=True)
    ids = [f"{i:06d}" for i in range(count)]
    for image_id, photo in zip(ids, photographs(SIZE, count), strict=True):
        cv2.imwrite(str(root / "JPEGImages" / f"{image_id}.jpg"), photo[..., ::-1])
    (root / "ImageSets" / "Segmentation" / f"{split}.txt").write_text("\n".join(ids) + "\n")
    one_hot = np.eye(len(classes) - 1, dtype=np.uint8)
    labels = {image_id: one_hot[i % len(one_hot)] for i, image_id in enumerate(ids)}
    save_labels(root / "cls_labels.json", labels, classes)


class HostNormalized(VOCClsDataset):
    """The loader's crops as they were before they shipped as uint8: float32, normalised on the host by
    albumentations' ``Normalize``, the last step of the augmentation's pipeline then."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        host = A.Normalize(mean=self.mean, std=self.std, max_pixel_value=255.0)
        self.augment = NormalizingAugment(self.augment, host)


@dataclass
class NormalizingAugment:
    """``augment``'s crops normalised by ``normalize`` in the worker (picklable, for the loader's processes)."""

    augment: TrainAugment
    normalize: A.Normalize

    def pixels(self, image: np.ndarray, mask: np.ndarray | None, seed: int) -> Sample:
        sample = self.augment.pixels(image, mask, seed)
        return replace(sample, image=self.normalize(image=sample.image)["image"].astype(np.float32))


@contextlib.contextmanager
def restarted_each_epoch() -> Iterator[None]:
    """The loader as it was before its workers lived across epochs: started anew for each (``persistent_workers``
    off)."""
    loader = train_module.DataLoader

    def restarting(*args: Any, **kwargs: Any) -> Any:
        return loader(*args, **{**kwargs, "persistent_workers": False})

    train_module.DataLoader = restarting
    try:
        yield
    finally:
        train_module.DataLoader = loader


def images_per_second(dataset: VOCClsDataset, cfg, workers: int, batches: int, before: bool = False) -> float:
    """The loader's images/s over ``batches`` batches, after ``max(2, 2 * workers)`` untimed ones (``before``: its
    workers restarted each epoch)."""
    cfg = apply_options(cfg, {"data.num_workers": workers})
    with restarted_each_epoch() if before else contextlib.nullcontext():
        stream = training_batches(dataset, cfg, 0, torch.device("cpu"), 1, 0)
    for _ in range(max(2, 2 * workers)):
        next(stream)
    tic = time.perf_counter()
    for _ in range(batches):
        next(stream)
    seconds = time.perf_counter() - tic
    stream.close()  # the workers stop with their loader's iterator
    return batches * cfg.train.batch_size / seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/voc_centered.py")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2], help="data.num_workers, one row each")
    parser.add_argument("--images", type=int, default=64, help="JPEGs written (the loader cycles through them)")
    parser.add_argument("--root", type=Path, help="time this dataset instead (data.root; its train split and labels)")
    parser.add_argument("--batches", type=int, default=24, help="timed batches per row")
    parser.add_argument("--goal", type=float, default=30.0, help="iterations/s the loader should feed (issue 36: 30)")
    parser.add_argument("--cfg-options", nargs="+", metavar="KEY=VALUE", help="override config values")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(args.config, parse_cfg_options(args.cfg_options))
        if args.root is not None:
            cfg = apply_options(cfg, {"data.root": str(args.root)})
            source = f"{args.root}, split {cfg.data.train_split}"
        else:
            classes = config_classes(cfg.data)  # a class file under the config's own root is read there
            write_voc_layout(Path(tmp) / "voc", args.images, classes, Path(cfg.data.train_split).stem)
            cfg = apply_options(cfg, {"data.root": str(Path(tmp) / "voc"), "data.label_file": "cls_labels.json",
                                      "data.classes": classes})  # fmt: skip
            source = f"{args.images} JPEGs of {SIZE[1]} x {SIZE[0]}"
        mean_std = backbone_mean_std(cfg.model.backbone)
        datasets = [kind(cfg.data, *mean_std, seed=cfg.train.seed) for kind in (VOCClsDataset, HostNormalized)]
        batch = cfg.train.batch_size
        print(f"{args.config}: crop {cfg.data.crop_size}, scales {tuple(cfg.data.scale_range)}, batch {batch}; "
              f"{source}; {args.batches} batches timed per row")  # fmt: skip
        print("\n| data.num_workers | uint8 crops, images/s | uint8, workers restarted each epoch | float32 crops, "
              "workers restarted each epoch (before) | ratio | iterations/s fed (uint8) | goal |")  # fmt: skip
        print("|---:|---:|---:|---:|---:|---:|---:|")
        rates = {}
        for workers in args.workers:
            rate = images_per_second(datasets[0], cfg, workers, args.batches)
            restarted, before = (images_per_second(dataset, cfg, workers, args.batches, True) for dataset in datasets)
            rates[workers] = rate
            print(f"| {workers} | {rate:.1f} | {restarted:.1f} | {before:.1f} | {rate / before:.2f} | "
                  f"{rate / batch:.1f} | {args.goal:g} |")  # fmt: skip
    if 1 in rates:  # one worker's rate through the loader (its collation and shared memory included)
        need = math.ceil(args.goal * batch / rates[1])
        print(f"\n{args.goal:g} it/s at batch {batch} needs {args.goal * batch:g} images/s: {need} worker(s), each "
              f"on a core of its own, at one worker's {rates[1]:.1f} images/s")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
