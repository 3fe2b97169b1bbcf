"""CAM and pseudo-label quality on a labelled split (the paper's Tables 3-4).

As in the WSSS literature, the image-level labels come from the ground-truth masks of the split (the
foreground classes present), so the scores measure localisation, not classification:

- CAM mIoU: multi-scale flipped CAMs (:func:`wsss.cam.multiscale_cam` at ``cfg.cam.scales``) of the final
  or the auxiliary classifier, turned into label maps with a constant background score ``t``
  (:func:`wsss.cam.cam_to_label`) for every ``t`` of a sweep; one confusion matrix per threshold.
- Pseudo-label mIoU, two numbers from one PAR pass:

  - *certain pixels* (the training loss's view): dual threshold (``cfg.cam.fg_thresh`` / ``bg_thresh``) +
    PAR refinement (:func:`wsss.pseudo_label.pseudo_labels`, as during training, on the full image); the
    pixels it marks uncertain (``ignore_index``) are excluded from scoring, and the fraction they make of
    the scored pixels (ground truth in [0, C)) is reported beside the mIoU. Not comparable with published
    pseudo-label tables, which score every pixel.
  - *every pixel* (comparable with the paper's Table 3): the same CAMs and PAR with a single background
    plane at ``cfg.cam.infer_bg_thresh``, so every pixel gets a class and every pixel with ground truth in
    [0, C) is scored.

Under ``torchrun`` (an initialised process group) each rank scores every ``world``-th image (rank r: images r,
r + world, ...; no image twice, none padded in) into its own confusion matrices, writes that share's CAMs and
pseudo labels, and the matrices are summed across ranks on the device: every score equals one process's exactly.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Subset
from tqdm import tqdm

from wsss.cam import labels_from_mask, multiscale_cam
from wsss.config import Config
from wsss.data.classes import voc_palette
from wsss.data.transforms import channel_constants, denormalize
from wsss.data.voc import SkipUnreadable, VOCSegDataset
from wsss.evaluation.metrics import ConfusionMatrix, SegMetrics, format_table
from wsss.evaluation.protocol import EvalProtocol, is_voc
from wsss.inference.folder.batching import SizeBuckets, default_batch_size, identity
from wsss.model_file import config_from_checkpoint, model_from_checkpoint
from wsss.models.segmentor import WSSSModel
from wsss.par import PAR
from wsss.pseudo_label import combine_dual_threshold, refine_cams_with_par
from wsss.utils.distributed import init_distributed, raise_on_every_rank, rank_and_world
from wsss.utils.fileio import atomic_write_bytes, atomic_write_text, save_mask
from wsss.utils.tensors import fp32_products, model_dtype, model_precision, to_device

__all__ = ["CamEvalResult", "default_work_dir", "evaluate_cams", "parse_thresholds", "run_cam_eval", "sweep_labels"]


def parse_thresholds(spec: str) -> list[float]:
    """``"0.3:0.7:0.05"`` (start:stop:step, stop included) or ``"0.3,0.5"`` -> sorted thresholds.

    Raises:
        ValueError: A malformed spec, a non-positive step, or a value outside [0, 1].
    """
    try:
        if ":" in spec:
            start, stop, step = (float(v) for v in spec.split(":"))
            if step <= 0 or stop < start:
                raise ValueError
            count = math.floor((stop - start) / step + 1e-9) + 1
            values = [round(start + i * step, 10) for i in range(count)]
        else:
            values = [float(v) for v in spec.split(",") if v.strip()]
    except ValueError:
        raise ValueError(
            f"bad threshold spec {spec!r}: use start:stop:step (e.g. 0.3:0.7:0.05) or a list (0.3,0.5)"
        ) from None
    if not values or any(not 0.0 <= v <= 1.0 for v in values):
        raise ValueError(f"thresholds must lie in [0, 1], got {values}")
    return sorted(set(values))


def sweep_labels(cam: Tensor, labels: Tensor, thresholds: Sequence[float]) -> Tensor:
    """:func:`wsss.cam.cam_to_label` for several background thresholds at the cost of one max.

    Args:
        cam: (B, C-1, H, W) CAMs in [0, 1].
        labels: (B, C-1) multi-hot image labels.
        thresholds: T background scores.

    Returns:
        (T, B, H, W) long label maps.
    """
    masked = cam.masked_fill(~labels.to(torch.bool)[:, :, None, None], float("-inf"))
    value, index = masked.max(dim=1)
    fg = index + 1
    return torch.stack([torch.where(value > t, fg, torch.zeros_like(fg)) for t in thresholds])


@dataclass
class CamEvalResult:
    """Scores of :func:`evaluate_cams` (percent).

    Attributes:
        thresholds: The background thresholds swept.
        cam: Threshold -> metrics of the CAM label maps.
        num_images: Images scored.
        pseudo: Metrics of the dual-threshold pseudo labels (uncertain pixels excluded), or None.
        pseudo_ignored_fraction: Fraction of the scored pixels (gt in [0, C)) the pseudo labels ignore.
        pseudo_all: Metrics of the single-threshold PAR labels over every pixel (paper-comparable), or None.
        info: What was evaluated (split, classifier, scales, ...), copied into the JSON.
    """

    thresholds: list[float]
    cam: dict[float, SegMetrics]
    num_images: int
    pseudo: SegMetrics | None = None
    pseudo_ignored_fraction: float | None = None
    pseudo_all: SegMetrics | None = None
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def best_threshold(self) -> float:
        """The threshold with the highest CAM mIoU (the lowest one on ties)."""
        return max(self.thresholds, key=lambda t: (self.cam[t]["mIoU"], -t))

    @property
    def best_miou(self) -> float:
        return self.cam[self.best_threshold]["mIoU"]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the sweep (summary per threshold), the best threshold with its per-class table, pseudo."""
        best = self.best_threshold
        out: dict[str, Any] = {
            **self.info,
            "num_images": self.num_images,
            "cam_sweep": [{"bg_thresh": t, **self.cam[t].summary} for t in self.thresholds],
            "best": {"bg_thresh": best, **self.cam[best].to_dict()},
        }
        if self.pseudo is not None:
            out["pseudo_certain_pixels"] = {**self.pseudo.to_dict(), "ignored_fraction": self.pseudo_ignored_fraction}
            out["pseudo_every_pixel"] = self.pseudo_all.to_dict()
        return out

    def format(self) -> str:
        """The sweep as a table, the best threshold's per-class table, and the pseudo-label scores."""
        rows = [f"| {t:9.3f} | {self.cam[t]['mIoU']:6.2f} | {self.cam[t]['aAcc']:6.2f} | "
                f"{self.cam[t]['mAcc']:6.2f} |" for t in self.thresholds]  # fmt: skip
        rule = "+-----------+--------+--------+--------+"
        title = (
            f"CAM mIoU per background threshold: {self.info.get('classifier', 'final')} classifier, scales "
            f"{tuple(self.info.get('scales', ()))} with flips, {self.num_images} images of split "
            f"{self.info.get('split', '?')}, image-level labels from the ground-truth masks"
        )
        lines = [title, rule, "| bg thresh |   mIoU |   aAcc |   mAcc |", rule, *rows, rule]
        if "protocol" in self.info:
            lines.insert(0, EvalProtocol.from_dict(self.info["protocol"]).line())
        best = self.best_threshold
        lines.append(f"best CAM background threshold: {best:g} (mIoU {self.best_miou:.2f})")
        lines.append(format_table(self.cam[best], title=f"CAM at bg threshold {best:g}"))
        if self.pseudo is not None:
            thresholds = self.info.get("pseudo_thresholds", {})
            lines.append(
                format_table(
                    self.pseudo,
                    title=f"pseudo labels, certain pixels only (dual threshold {thresholds.get('fg')}/"
                    f"{thresholds.get('bg')} + PAR, the training loss's view; NOT comparable with published "
                    f"tables): mIoU {self.pseudo['mIoU']:.2f}, {100 * self.pseudo_ignored_fraction:.2f} % of the "
                    "pixels uncertain and not scored",
                )
            )
            lines.append(
                format_table(
                    self.pseudo_all,
                    title=f"pseudo labels, every pixel scored (background plane {thresholds.get('single')} + "
                    f"PAR; comparable with the paper's Table 3): mIoU {self.pseudo_all['mIoU']:.2f}",
                )
            )
        return "\n".join(lines)


def _safe_file(folder: Path, name: str, suffix: str) -> Path:
    path = folder / f"{name}{suffix}"
    if ".." in Path(name).parts or Path(name).is_absolute():
        raise ValueError(f"refusing to write {path}: the id {name!r} leaves {folder}")
    if not Path(os.path.realpath(path)).is_relative_to(os.path.realpath(folder)):
        raise ValueError(f"refusing to write {path}: it resolves outside {folder}")
    return path


@torch.no_grad()
def evaluate_cams(
    model: WSSSModel,
    dataset: VOCSegDataset,
    cfg: Config,
    thresholds: Sequence[float],
    device: str | torch.device = "cpu",
    aux: bool = False,
    pseudo: bool = False,
    cam_dir: str | Path | None = None,
    pseudo_dir: str | Path | None = None,
    max_images: int | None = None,
    progress: bool = True,
    batch_size: int | None = None,
) -> CamEvalResult:
    """Score CAMs over a background-threshold sweep (and optionally pseudo labels) on ``dataset``.

    Args:
        model: The model, in eval mode.
        dataset: Full images with masks; image-level labels are taken from the masks.
        cfg: ``cam.scales`` for the CAMs; ``cam.fg_thresh``, ``cam.bg_thresh``, ``par.*`` and
            ``data.ignore_index`` for the pseudo labels.
        thresholds: Background thresholds to sweep.
        device: Where the model and the counting run.
        aux: Score the auxiliary classifier's CAMs instead of the final one's.
        pseudo: Also score the pseudo labels made from these CAMs.
        cam_dir: Save every CAM as ``<id>.npy``, (C-1, H, W) float16 in [0, 1] (zero for absent classes).
        pseudo_dir: Save every pseudo label as ``<id>.png`` (VOC palette, ``ignore_index`` = uncertain).
        max_images: Score only the first images.
        progress: Show a progress bar (on rank 0 alone).
        batch_size: Most same-size images per forward batch (also at most ``infer.batch_pixels`` pixels); None:
            ``infer.batch_size`` on a GPU, ``infer.cpu_batch_size`` elsewhere. The scores do not depend on it.

    Under an initialised process group (``torchrun``), every rank must call it: each scores and saves its share of
    the images (every ``world``-th one), and the counts are summed across ranks, so every rank returns the scores
    of all the images, equal to one process's. A rank whose share is empty still joins the sum.

    Raises:
        ValueError: An image or mask cannot be read, or a mask does not fit its image or the classes (the same
            line on every rank, naming the file).
    """
    device = torch.device(device)
    num_classes = len(dataset.classes)
    ignore = cfg.data.ignore_index
    thresholds = list(thresholds)
    if not thresholds:
        raise ValueError("need at least one background threshold")
    cams_cm = [ConfusionMatrix(num_classes, ignore, device=device) for _ in thresholds]
    pseudo_cm = ConfusionMatrix(num_classes, ignore, device=device)
    pseudo_all_cm = ConfusionMatrix(num_classes, ignore, device=device)
    par = PAR.from_config(cfg.par).to(device)
    constants = channel_constants(dataset.mean, device), channel_constants(dataset.std, device)  # uploaded once
    pseudo = pseudo or pseudo_dir is not None
    total = len(dataset) if max_images is None else min(max_images, len(dataset))
    rank, world = rank_and_world()
    share = range(rank, total, world)
    batch_size = default_batch_size(cfg.infer, device) if batch_size is None else batch_size
    if batch_size < 1:
        raise ValueError(f"--batch-size: must be >= 1, got {batch_size}")
    # on the CPU the images are read in this process: a loader process takes a CPU from the model's threads
    # (tools/eval_cams.py counts it) and costs more than it saves there (docs/benchmarks.md)
    workers = cfg.data.num_workers if device.type == "cuda" else 0
    loader = DataLoader(Subset(SkipUnreadable(dataset), share), batch_size=None, num_workers=workers,
                        collate_fn=identity)  # fmt: skip
    buckets = SizeBuckets(batch_size, cfg.infer.batch_pixels)
    palette = voc_palette()
    cam_fn = partial(model.cam, aux=aux)
    planes = (cfg.cam.fg_thresh, cfg.cam.bg_thresh, cfg.cam.infer_bg_thresh)

    def score(batch: list[dict]) -> None:
        """Score a batch of same-size images; the host reads the device once per batch and export."""
        masks = torch.stack([item["mask"] for item in batch])
        present = torch.stack([labels_from_mask(m, num_classes) for m in masks])  # on the host: no read of the device
        images, gt, labels = (to_device(x, device) for x in (torch.stack([i["image"] for i in batch]), masks, present))
        with model_precision(cfg.infer.fp32_precision, cfg.infer.dtype, device):
            cam = multiscale_cam(cam_fn, images, labels, cfg.cam.scales, one_image_at_a_time=True)
        for cm, pred in zip(cams_cm, sweep_labels(cam, labels, thresholds), strict=True):
            cm.update(pred, gt)
        if cam_dir is not None:
            for item, image_cams in zip(batch, cam.to(torch.float16).cpu().numpy(), strict=True):
                buf = io.BytesIO()
                np.save(buf, image_cams)
                atomic_write_bytes(_safe_file(Path(cam_dir), item["id"], ".npy"), buf.getvalue())
        if pseudo:
            images01 = denormalize(images, *constants)
            high, low, single = refine_cams_with_par(images01, cam, labels, planes, par, cfg.par.scale,
                                                     int(present.sum(dim=1).max()))  # fmt: skip
            label = combine_dual_threshold(high, low, None, ignore)
            pseudo_all_cm.update(single, gt)
            pseudo_cm.update(label, gt.masked_fill(label == ignore, ignore))
            if pseudo_dir is not None:
                for item, mask in zip(batch, label.cpu().numpy(), strict=True):
                    save_mask(_safe_file(Path(pseudo_dir), item["id"], ".png"), mask, palette)

    bar = tqdm(loader, total=len(share), desc="cam eval", unit="img", disable=not progress or rank != 0,
               dynamic_ncols=True)  # fmt: skip
    unreadable = None
    for item in bar:
        if "skipped" in item:  # an image or mask that cannot be read stops the scoring, on every rank alike
            unreadable = item["skipped"]
            break
        for batch in buckets.add(item, tuple(item["mask"].shape)):
            score(batch)
    for batch in buckets.flush() if unreadable is None else []:
        score(batch)

    raise_on_every_rank(unreadable)
    for cm in (*cams_cm, pseudo_cm, pseudo_all_cm):
        cm.all_reduce()
    # pixels with ground truth in [0, C): all of them (pseudo_all_cm) and those the pseudo labels are certain of
    scored, certain = (int(cm.counts[:num_classes].sum()) for cm in (pseudo_all_cm, pseudo_cm))
    names = list(dataset.classes)
    pseudo_thresholds = {"fg": cfg.cam.fg_thresh, "bg": cfg.cam.bg_thresh, "single": cfg.cam.infer_bg_thresh}
    return CamEvalResult(
        thresholds=thresholds,
        cam={t: cm.compute(class_names=names) for t, cm in zip(thresholds, cams_cm, strict=True)},
        num_images=total,
        pseudo=pseudo_cm.compute(class_names=names) if pseudo else None,
        pseudo_ignored_fraction=((scored - certain) / scored if scored else float("nan")) if pseudo else None,
        pseudo_all=pseudo_all_cm.compute(class_names=names) if pseudo else None,
        info={
            "classifier": "aux" if aux else "final",
            "scales": list(cfg.cam.scales),
            "flip": True,
            "labels": "from the ground-truth masks",
            "pseudo_thresholds": pseudo_thresholds if pseudo else None,
        },
    )


def run_cam_eval(
    checkpoint: str | Path,
    split: str = "train",
    thresholds: Sequence[float] = (0.5,),
    out: str | Path | None = None,
    device: str | torch.device = "cpu",
    data_root: str | Path | None = None,
    aux: bool = False,
    pseudo: bool = False,
    save_cams: bool = False,
    save_pseudo: bool = False,
    max_images: int | None = None,
    progress: bool = True,
    work_dir: str | Path | None = None,
    batch_size: int | None = None,
) -> tuple[CamEvalResult, Path]:
    """Rebuild the model and dataset from a model file, run :func:`evaluate_cams`, write ``cam_eval.json``.

    Args:
        checkpoint: A wsss checkpoint or a ``tools/export.py --safetensors`` export (its config names the dataset).
        split: Split name or file of the dataset (needs masks for every id).
        thresholds: Background thresholds to sweep.
        out: Output folder; default ``<work_dir>/cam_eval_<checkpoint name>_<split>[_aux]``. Exports go to
            ``out/cams`` and ``out/pseudo``. Nothing is written beside the checkpoint.
        device: Where the model runs (under torchrun: ``cuda`` is each rank's ``cuda:LOCAL_RANK``, with NCCL; ``cpu``
            uses gloo).
        data_root: Overrides ``data.root`` of the checkpoint's config.
        aux, pseudo, max_images, progress, batch_size: See :func:`evaluate_cams`.
        save_cams: Export the CAMs. save_pseudo: Export the pseudo labels (implies ``pseudo``).
        work_dir: Where the default ``out`` goes; default :func:`default_work_dir`.

    Under ``torchrun`` every rank joins the process group and scores its share (:func:`evaluate_cams`); rank 0
    alone writes ``cam_eval.json``, once every rank's exports are written.

    Returns:
        The result (every rank's: the scores of all the images) and the JSON file (rank 0 writes it).
    """
    dist_info = init_distributed(str(device))
    device = dist_info.device if dist_info.enabled else device
    model, ckpt = model_from_checkpoint(checkpoint, device)
    cfg = config_from_checkpoint(ckpt)
    if data_root is not None:
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, root=str(data_root)))
    dataset = VOCSegDataset(cfg.data, tuple(ckpt["mean"]), tuple(ckpt["std"]), split=split)
    if list(dataset.classes) != list(ckpt["classes"]):
        raise ValueError(f"the dataset's classes {dataset.classes} differ from the checkpoint's {ckpt['classes']}")
    if out is None:
        work_dir = Path(work_dir) if work_dir is not None else default_work_dir(cfg, checkpoint)
        out = work_dir / f"cam_eval_{Path(checkpoint).stem}_{Path(split).stem}{'_aux' if aux else ''}"
    out = Path(out)
    result = evaluate_cams(
        model, dataset, cfg, thresholds, device, aux=aux, pseudo=pseudo or save_pseudo,
        cam_dir=out / "cams" if save_cams else None, pseudo_dir=out / "pseudo" if save_pseudo else None,
        max_images=max_images, progress=progress, batch_size=batch_size,
    )  # fmt: skip
    protocol = EvalProtocol(
        checkpoint=str(checkpoint), step=ckpt.get("step"), split=split, num_images=result.num_images,
        split_images=len(dataset), val_split=cfg.data.val_split, voc=is_voc(dataset.classes),
        scales=tuple(cfg.cam.scales), flip=True, crf=False, mask_classes="ground-truth labels",
        fp32_precision=fp32_products(cfg.infer.fp32_precision, device), dtype=model_dtype(cfg.infer.dtype, device),
    )  # fmt: skip
    result.info = {"checkpoint": str(checkpoint), "data_root": cfg.data.root, "split": split, **result.info,
                   "protocol": protocol.to_dict()}  # fmt: skip
    path = out / "cam_eval.json"
    if dist_info.is_main:  # after the sum across ranks, which every rank joins once its exports are written
        atomic_write_text(path, json.dumps(result.to_dict(), indent=2) + "\n")
    return result, path


def default_work_dir(cfg: Config, checkpoint: str | Path) -> Path:
    """``work_dirs/<run name>`` in the current folder, as mmseg's tools default: the run name is the last part of
    the work dir the checkpoint was trained in (``work_dirs/voc_centered`` -> ``voc_centered``, the config's name for
    the configs of ``configs/``), else the name of the checkpoint's folder."""
    name = Path(cfg.work_dir).name if cfg.work_dir else Path(checkpoint).resolve().parent.name
    return Path("work_dirs") / name
