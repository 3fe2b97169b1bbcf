"""Score a checkpoint on a config's validation split (``tools/test.py``, mmseg's ``tools/test.py`` spelling).

The predictions come from :func:`wsss.inference.runner.run_inference` (the same masks ``tools/infer.py`` writes)
and are scored as :func:`wsss.evaluation.folders.evaluate_folders` scores them (the same numbers ``tools/eval.py``
prints). As in mmseg, three folders can be named: the run folder (``metrics.json``), ``out`` (the predicted masks)
and ``show_dir`` (the painted images and their gallery); the checkpoint's own folder is only read.

Under ``torchrun`` every rank predicts its share of the split (``run_inference``), then counts every ``world``-th
mask of the split into its confusion matrix (no mask twice, none padded in); the matrices are summed across ranks on
the device, so the scores equal one process's exactly, and rank 0 alone writes ``metrics.json``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from wsss.config import Config, to_dict
from wsss.data.voc import config_classes, read_split, resolve_split
from wsss.evaluation.folders import index_masks, iter_mask_pairs, save_metrics_json
from wsss.evaluation.metrics import ConfusionMatrix, SegMetrics
from wsss.inference.runner import InferenceOptions, InferenceSummary, run_inference
from wsss.inference.sources import check_output_folder, output_paths, writing
from wsss.model_file import read_model_file
from wsss.utils.distributed import all_gather_objects, barrier, init_distributed, raise_on_every_rank, rank_and_world
from wsss.utils.fileio import atomic_write_bytes


@dataclass
class SplitEvaluation:
    """What :func:`evaluate_checkpoint` produced: the scores, the inference run, and where they are."""

    metrics: SegMetrics
    inference: InferenceSummary
    metrics_file: Path
    masks: Path
    """The folder of the predicted masks (``<id>.png``)."""
    gallery: Path | None
    """``index.html`` of the painted images, if they were asked for."""


def evaluate_checkpoint(
    cfg: Config,
    checkpoint: str | Path,
    run_dir: str | Path,
    *,
    out: str | Path | None = None,
    show_dir: str | Path | None = None,
    tta: bool = False,
    device: str | torch.device = "cpu",
    progress: bool = True,
) -> SplitEvaluation:
    """Predict the masks of ``cfg.data.val_split`` with ``checkpoint`` and score them against ``cfg.data.mask_dir``.

    Every image is predicted afresh (masks an earlier run left in the same folder are replaced, never scored).

    Args:
        cfg: The config that names the dataset (root, val split, mask folder, classes, ignore index) and the
            inference settings (``infer.*``; the scales and flip only with ``tta``).
        checkpoint: A wsss checkpoint, or a ``tools/export.py --safetensors`` export.
        run_dir: Folder of ``metrics.json``; also of the predictions (``masks/``, with the inference run's
            ``run.json``, ``summary.json`` and ``labels/``) unless ``out`` or ``show_dir`` is given.
        out: Folder of the predicted masks (``masks/<id>.png``).
        show_dir: Folder of the painted images (``overlays/``, ``cams/``, ``thumbs/``, ``gt/``, ``index.html``)
            with the masks they show and the inference run's files; the masks are copied to ``out`` when both
            are given.
        tta: Multi-scale + flip (``cfg.infer.scales``, ``cfg.infer.flip``); otherwise one scale, no flip.
        device: Where the model runs and the confusion matrix is counted (under torchrun: ``cuda`` is each rank's
            ``cuda:LOCAL_RANK``, with NCCL; ``cpu`` uses gloo).
        progress: Progress bars (on rank 0 alone).

    Under ``torchrun`` every rank joins the process group, predicts and scores its share and returns the scores of
    the whole split; rank 0 alone writes ``metrics.json``, once every rank's masks are written.

    Raises:
        FileNotFoundError: The checkpoint, the dataset root, the split or the mask folder is missing.
        ValueError: The checkpoint's classes differ from the config's, the masks do not fit them, or an output
            folder could overwrite the dataset.
        OutputError: An output could not be written (one line naming it).
    """
    dist_info = init_distributed(str(device))
    device = dist_info.device if dist_info.enabled else device
    progress = progress and dist_info.is_main
    root = Path(cfg.data.root)
    classes = config_classes(cfg.data)
    trained = list(read_model_file(checkpoint)["classes"])
    if trained != classes:
        raise ValueError(
            f"{checkpoint} was trained on classes {trained}, the config names {classes}: "
            "evaluate with the config the checkpoint was trained with"
        )
    for folder in (run_dir, out):
        if folder is not None:
            check_output_folder(root, folder)
    predicted = Path(show_dir or out or run_dir)
    options = InferenceOptions(
        scales=cfg.infer.scales if tta else (1.0,), flip=cfg.infer.flip and tta, gallery=show_dir is not None,
        overwrite=True, progress=progress, cfg_options={f"infer.{k}": v for k, v in to_dict(cfg)["infer"].items()},
    )  # fmt: skip
    summary = run_inference(checkpoint, root, predicted, cfg.data.val_split, options, device)
    ids = read_split(resolve_split(root, cfg.data.val_split))
    masks = predicted / "masks"
    metrics = score_masks(masks, root / cfg.data.mask_dir, ids, classes, cfg.data.ignore_index, device,
                          cfg.data.num_workers, progress)  # fmt: skip
    if out is not None and Path(out) != predicted:
        masks = copy_masks(predicted, Path(out), ids[dist_info.rank :: dist_info.world_size])
        barrier()  # every rank's share copied
    metrics_file = Path(run_dir) / "metrics.json"
    if dist_info.is_main:
        with writing(metrics_file):
            save_metrics_json(metrics, metrics_file, checkpoint=str(checkpoint), split=cfg.data.val_split, tta=tta,
                              predictions=str(masks))  # fmt: skip
    gallery = predicted / "index.html" if show_dir is not None else None
    return SplitEvaluation(metrics, summary, metrics_file, masks, gallery)


def score_masks(
    masks: Path,
    gt_dir: Path,
    ids: list[str],
    classes: list[str],
    ignore_index: int,
    device: str | torch.device,
    num_workers: int,
    progress: bool,
) -> SegMetrics:
    """Score the predicted masks of ``ids`` against their ground truth: the numbers of
    :func:`wsss.evaluation.folders.evaluate_folders` (masks matched by relative path without extension).

    Under an initialised process group every rank must call it: rank r counts the masks ``ids[r::world]`` (a share
    may be empty) and the counts are summed across ranks, so every rank returns the scores of all ``ids``, equal to
    one process's exactly.

    Args:
        masks: Folder of the predicted masks.
        gt_dir: Folder of the ground-truth masks.
        ids: The names to score (relative paths without extension).
        classes: The C class names; labels are 0..C-1.
        ignore_index: Ground-truth label that is not scored.
        device: Where the counts are kept and summed.
        num_workers: Decoding threads (0: decode in the calling thread).
        progress: Show a progress bar.

    Raises:
        ValueError: An id without ground truth or without a prediction, an unreadable mask, a size mismatch, or
            ground-truth labels outside [0, C) that are not ignored (the same line on every rank, naming the files).
    """
    gts, preds = index_masks(gt_dir), index_masks(masks)
    for found, folder, what in ((gts, gt_dir, "ground truth"), (preds, masks, "prediction")):
        absent = [i for i in ids if i not in found]
        if absent:
            raise ValueError(f"{len(absent)} of {len(ids)} ids of the split have no {what} in {folder}: "
                             f"{', '.join(absent[:5])}{', ...' * (len(absent) > 5)}")  # fmt: skip
    rank, world = rank_and_world()
    share = ids[rank::world]
    cm = ConfusionMatrix(len(classes), ignore_index, device=device)
    bad_gt, unreadable = [], None
    loaded = iter_mask_pairs(((i, preds[i], gts[i]) for i in share), num_workers)
    try:
        for key, pred, gt in tqdm(loaded, total=len(share), desc="eval", unit="img", disable=not progress):
            counts = cm.count(pred, gt)
            if counts[len(classes)].any():
                bad_gt.append(str(gts[key]))
            cm.merge(counts)
    except ValueError as err:  # a mask unreadable or of another size: this rank's share stops there
        unreadable = str(err)
    raise_on_every_rank(unreadable)
    bad_gt = [path for part in all_gather_objects(bad_gt) for path in part]  # every rank raises, or none does
    if bad_gt:
        raise ValueError(
            f"{len(bad_gt)} ground-truth masks have labels outside [0, {len(classes)}) other than {ignore_index}: "
            f"{', '.join(bad_gt[:5])}; is data.classes the list the masks were drawn with?"
        )
    return cm.all_reduce().compute(class_names=classes)


def copy_masks(source: Path, target: Path, ids: list[str]) -> Path:
    """Copy the masks of ``ids`` from ``source/masks`` to ``target/masks`` (each atomically); that folder.

    Raises:
        OutputError: A mask could not be written (one line naming it).
    """
    for image_id in ids:
        src, dst = (output_paths(folder, image_id, ["masks"])["masks"] for folder in (source, target))
        if src.is_file():
            with writing(dst):
                atomic_write_bytes(dst, src.read_bytes())
    return target / "masks"
