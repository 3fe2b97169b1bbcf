"""The pseudo-label export and the CAM evaluation by batch size: the operations dispatched per image (the CPU's measure
of a GPU's launches) and the images/s on this machine.

``tools/make_pseudo_labels.py`` (:func:`wsss.inference.exports.pseudo_labels.export_pseudo_labels`, no CRF) and
``tools/eval_cams.py --pseudo`` (:func:`wsss.evaluation.cam_eval.evaluate_cams`, the thresholds 0.3:0.7:0.05) run on
a toy set (``make_toy_voc``) whose images and masks are all resized to one size, so that every batch is full, with a
randomly initialised model of ``--config`` (``model.pretrained=""``; the toy's 7 classes).

- ``ops / image``: the non-view ATen operations this process dispatches (:class:`wsss.utils.op_count.OpCounter`; a
  launch of PAR's Triton kernels counts as one, run in Triton's interpreter without a GPU) for ``2 b`` images less
  those for ``b`` images, over ``b``, at batch size ``b`` and ``--count-size`` (the counts do not depend on the image
  size), on ``--device``: what one more image costs, the set-up (the model's loading, the constants) cancelled out. On
  a GPU each is about one kernel launch; at batch 1 they are the per-image host overhead that batching divides.
  ``--crf`` adds the export with ``--crf`` as a GPU runs it: the CRF in the exporting process (``CrfPool`` without
  ``device="cpu"``), a batch's images in shared mean-field runs; its products in PyTorch (``infer.crf.kernel=torch``:
  Triton's interpreter takes 90 s for one 64 x 48 image), where a GPU's fused kernels launch fewer per run. With
  ``--time`` it adds the export with ``--crf`` as the tool runs it on ``--device``.
- ``images/s`` (``--time``): wall time of the whole call for ``--num`` images at ``--size`` (the model's loading
  included), the better of ``--repeats``, on ``--device`` (PAR in PyTorch on the CPU, its Triton kernels on a GPU).

Usage::

    python bench/bench_export.py --batch-sizes 1 4 16 [--crf]
    python bench/bench_export.py --config configs/toy_centered.py --time --num 32 --batch-sizes 1 8
    python bench/bench_export.py --device cuda --time --num 256 --batch-sizes 1 16
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch
from PIL import Image

if not torch.cuda.is_available():  # PAR's Triton kernels (--par-kernel fused) on CPU tensors, before wsss.par_kernel
    os.environ.setdefault("TRITON_INTERPRET", "1")

from wsss import par_kernel  # noqa: E402
from wsss.config import load_config  # noqa: E402
from wsss.data.labels import labels_from_masks, save_labels  # noqa: E402
from wsss.data.toy.dataset import make_toy_voc  # noqa: E402
from wsss.data.toy.render import TOY_CLASSES  # noqa: E402
from wsss.data.transforms import backbone_mean_std  # noqa: E402
from wsss.data.voc import VOCSegDataset  # noqa: E402
from wsss.engine.checkpoint import save_checkpoint  # noqa: E402
from wsss.evaluation.cam_eval import evaluate_cams, parse_thresholds  # noqa: E402
from wsss.inference.crf import CrfPool  # noqa: E402
from wsss.inference.exports import pseudo_labels as export_module  # noqa: E402
from wsss.inference.exports.pseudo_labels import ExportOptions, export_pseudo_labels  # noqa: E402
from wsss.model_file import config_from_checkpoint, model_from_checkpoint  # noqa: E402
from wsss.models import build_model  # noqa: E402
from wsss.utils.op_count import OpCounter  # noqa: E402

THRESHOLDS = "0.3:0.7:0.05"  # tools/eval_cams.py's default sweep
KERNELS = ("_affinity_kernel", "_propagate_kernel")  # PAR's Triton kernels


def make_set(folder: Path, num: int, size: tuple[int, int], splits: set[int]) -> Path:
    """The toy set with ``num`` train images, every image and mask resized to ``size`` (W, H); the split ``firstN``
    of the first N images for each N of ``splits``."""
    root = make_toy_voc(folder, num_train=num, num_val=1)
    ids = [f"train_{i:05d}" for i in range(num)]
    for image_id in ids:
        image, mask = root / "JPEGImages" / f"{image_id}.jpg", root / "SegmentationClass" / f"{image_id}.png"
        Image.open(image).resize(size).save(image, quality=90)
        Image.open(mask).resize(size, Image.NEAREST).save(mask)
    labels = labels_from_masks(root / "SegmentationClass", len(TOY_CLASSES), progress=False)
    save_labels(root / "cls_labels.json", labels, list(TOY_CLASSES))
    for count in splits:
        (root / "ImageSets" / "Segmentation" / f"first{count}.txt").write_text("\n".join(ids[:count]) + "\n")
    return root


def make_checkpoint(config: str, root: Path, path: Path, par: str) -> Path:
    """A randomly initialised model of ``config`` for the toy set at ``root``, its PAR with ``par.kernel=par``."""
    options = {"model.pretrained": "", "data.root": str(root), "data.classes": list(TOY_CLASSES),
               "data.mask_dir": "SegmentationClass", "data.num_workers": 0, "par.kernel": par}  # fmt: skip
    cfg = load_config(config, options)
    torch.manual_seed(0)
    model = build_model(cfg.model, num_classes=len(TOY_CLASSES))
    save_checkpoint(path, model, cfg, list(TOY_CLASSES), *backbone_mean_std(cfg.model.backbone), step=0)
    return path


def run_export(ckpt: Path, out: Path, images: int, batch_size: int, device: str, crf: bool = False) -> None:
    options = ExportOptions(split=f"first{images}", batch_size=batch_size, num_workers=0, overwrite=True,
                            progress=False, crf=crf)  # fmt: skip
    export_pseudo_labels(ckpt, out, options, device)


def run_export_crf_as_on_a_gpu(ckpt: Path, out: Path, images: int, batch_size: int, device: str) -> None:
    """The export with the CRF as on a GPU, its products in PyTorch (the module docstring)."""
    options = ExportOptions(split=f"first{images}", batch_size=batch_size, num_workers=0, overwrite=True,
                            progress=False, crf=True, cfg_options={"infer.crf.kernel": "torch"})  # fmt: skip
    pool = export_module.CrfPool
    export_module.CrfPool = lambda cfg, workers, device: CrfPool(cfg, workers)  # in this process, as on a GPU
    try:
        export_pseudo_labels(ckpt, out, options, device)
    finally:
        export_module.CrfPool = pool


def run_cam_eval(ckpt: Path, images: int, batch_size: int, device: str) -> None:
    model, raw = model_from_checkpoint(ckpt, device)
    cfg = config_from_checkpoint(raw)
    dataset = VOCSegDataset(cfg.data, tuple(raw["mean"]), tuple(raw["std"]), split=f"first{images}")
    evaluate_cams(model.eval(), dataset, cfg, parse_thresholds(THRESHOLDS), device, pseudo=True, progress=False,
                  batch_size=batch_size)  # fmt: skip


def ops(run) -> int:
    """The operations ``run()`` dispatches, a launch of PAR's Triton kernels counted as one."""
    counter = OpCounter()
    originals = {name: getattr(par_kernel, name) for name in KERNELS}
    try:
        for name, kernel in originals.items():
            setattr(par_kernel, name, counter.launches(kernel))
        with counter:
            run()
    finally:
        for name, kernel in originals.items():
            setattr(par_kernel, name, kernel)
    return sum(counter.counts.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/voc_centered.py", help="the model's config")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--count-size", type=int, nargs=2, default=(64, 48), metavar=("W", "H"))
    parser.add_argument("--time", action="store_true", help="also time --num images at --size")
    parser.add_argument("--crf", action="store_true", help="also count the export with --crf as on a GPU")
    parser.add_argument("--num", type=int, default=16)
    parser.add_argument("--size", type=int, nargs=2, default=(500, 375), metavar=("W", "H"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--par-kernel", default="fused", choices=("fused", "torch"),
                        help="par.kernel: fused (the GPU's Triton kernels; in Triton's interpreter on a CPU) or torch")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    machine = platform.processor() or platform.machine()
    print(f"{machine}, torch {torch.__version__}, {torch.get_num_threads()} threads, device {args.device}, config "
          f"{args.config}, par.kernel {args.par_kernel} for the counts")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        counts = {n for b in args.batch_sizes for n in (b, 2 * b)}
        small = make_set(work / "small", max(counts), tuple(args.count_size), counts)
        ckpt = make_checkpoint(args.config, small, work / "small.pth", args.par_kernel)
        runs = {"export": partial(run_export, ckpt, work / "out"), "eval_cams --pseudo": partial(run_cam_eval, ckpt)}
        if args.crf:
            runs["export --crf"] = partial(run_export_crf_as_on_a_gpu, ckpt, work / "out")
        print(f"| batch size | {' | '.join(f'{name} ops / image' for name in runs)} |\n|---:{'|---:' * len(runs)}|")
        for b in args.batch_sizes:
            counts = [[ops(partial(run, n, b, args.device)) for n in (b, 2 * b)] for run in runs.values()]
            print(f"| {b} | {' | '.join(f'{(c[1] - c[0]) / b:,.0f}' for c in counts)} |", flush=True)
        if not args.time:
            return 0
        large = make_set(work / "large", args.num, tuple(args.size), {args.num})
        ckpt = make_checkpoint(args.config, large, work / "large.pth", "fused" if args.device != "cpu" else "torch")
        timed = {"export": partial(run_export, ckpt, work / "out"), "eval_cams --pseudo": partial(run_cam_eval, ckpt)}
        if args.crf:  # the CRF as the tool runs it on --device
            timed["export --crf"] = partial(run_export, ckpt, work / "out", crf=True)
        print(f"\n{args.num} images of {args.size[0]} x {args.size[1]}, images/s (seconds)\n"
              f"| batch size | {' | '.join(timed)} |\n|---:{'|---:' * len(timed)}|")  # fmt: skip
        for b in args.batch_sizes:
            rates = []
            for run in timed.values():
                best = np.inf
                for _ in range(args.repeats):
                    tic = time.perf_counter()
                    run(args.num, b, args.device)
                    if args.device.startswith("cuda"):
                        torch.cuda.synchronize()
                    best = min(best, time.perf_counter() - tic)
                rates.append(f"{args.num / best:.2f} ({best:.1f} s)")
            print(f"| {b} | {' | '.join(rates)} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
