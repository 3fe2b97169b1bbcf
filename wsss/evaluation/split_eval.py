"""Score a checkpoint on a config's validation split (``tools/test.py``, mmseg's ``tools/test.py`` spelling), or
format its masks of a split without ground truth for the VOC server (``--format-only``).

The predictions come from :func:`wsss.inference.folder.runner.run_inference` (the same masks ``tools/infer.py`` writes)
and are scored as :func:`wsss.evaluation.folders.evaluate_folders` scores them (the same numbers ``tools/eval.py``
prints). As in mmseg, three folders can be named: the run folder (``metrics.json``), ``out`` (the predicted masks)
and ``show_dir`` (the painted images and their gallery); the checkpoint's own folder is only read.

Under ``torchrun`` every rank predicts its share of the split (``run_inference``), then counts every ``world``-th
mask of the split into its confusion matrix (no mask twice, none padded in); the matrices are summed across ranks on
the device, so the scores equal one process's exactly, and rank 0 alone writes ``metrics.json``.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from wsss.config import Config, to_dict
from wsss.data.voc import config_classes, read_split, resolve_split
from wsss.evaluation.folders import index_masks, iter_mask_pairs, save_metrics_json
from wsss.evaluation.metrics import ConfusionMatrix, SegMetrics
from wsss.evaluation.protocol import EvalProtocol, is_voc
from wsss.evaluation.voc_submission import ARCHIVE_NAME, Submission, write_archive, write_submission
from wsss.inference.folder.layout import OutputLayout
from wsss.inference.folder.plan import LATER_SETTINGS
from wsss.inference.folder.runner import InferenceOptions, InferenceSummary, run_inference
from wsss.inference.folder.sources import writing
from wsss.model_file import model_settings_warning, read_model_file
from wsss.utils.distributed import all_gather_objects, barrier, init_distributed, raise_on_every_rank, rank_and_world
from wsss.utils.fileio import atomic_write_bytes, atomic_write_text


@dataclass
class SplitEvaluation:
    """What :func:`evaluate_checkpoint` produced: the scores (or the submission), the inference run, the protocol,
    and where they are."""

    metrics: SegMetrics | None
    """None with ``format_only``."""
    inference: InferenceSummary
    metrics_file: Path
    """``metrics.json``, or with ``format_only`` ``submission.json`` (the protocol and the archive's path)."""
    masks: Path
    """The folder of the predicted masks (``<id>.png``)."""
    gallery: Path | None
    """``index.html`` of the painted images, if they were asked for."""
    protocol: EvalProtocol
    submission: Submission | None = None
    """The VOC-server layout and archive, with ``format_only``."""


def evaluate_checkpoint(
    cfg: Config,
    checkpoint: str | Path,
    run_dir: str | Path,
    *,
    out: str | Path | None = None,
    show_dir: str | Path | None = None,
    tta: bool = False,
    crf: bool = False,
    device: str | torch.device = "cpu",
    progress: bool = True,
    split: str | None = None,
    format_only: bool = False,
) -> SplitEvaluation:
    """Predict the masks of ``split`` with ``checkpoint`` and score them against ``cfg.data.mask_dir``; with
    ``format_only``, lay them out for the VOC server under ``out`` instead (no ground truth needed).

    Every image is predicted afresh (masks an earlier run left in the same folder are replaced, never scored).

    Args:
        cfg: The config that names the dataset (root, val split, mask folder, classes, ignore index) and the
            inference settings (``infer.*``; the scales and flip only with ``tta``).
        checkpoint: A wsss checkpoint, or a ``tools/export.py --safetensors`` export.
        run_dir: Folder of ``metrics.json``; also of the predictions (``masks/``, with the inference run's
            ``run.json``, ``summary.json`` and ``labels/``) unless ``out`` or ``show_dir`` is given.
        out: Folder of the predicted masks (``masks/<id>.png``); with ``format_only`` of the server's layout.
        show_dir: Folder of the painted images (``overlays/``, ``cams/``, ``thumbs/``, ``gt/``, ``index.html``)
            with the masks they show and the inference run's files; the masks are copied to ``out`` when both
            are given.
        tta: Multi-scale + flip (``cfg.infer.scales``, ``cfg.infer.flip``); otherwise one scale, no flip.
        crf: Refine the masks with the dense CRF (``cfg.infer.crf``); with ``tta``, the paper's protocol.
        device: Where the model runs and the confusion matrix is counted (under torchrun: ``cuda`` is each rank's
            ``cuda:LOCAL_RANK``, with NCCL; ``cpu`` uses gloo).
        progress: Progress bars (on rank 0 alone).
        split: Split name or file (default ``cfg.data.val_split``).
        format_only: Score nothing: copy the masks to ``out/results/VOC2012/Segmentation/comp6_test_cls/`` and pack
            them into ``out/results.tar.gz`` (:mod:`wsss.evaluation.voc_submission`); the predictions themselves
            go to ``show_dir`` or ``out`` (``masks/``, as without ``format_only``), and ``run_dir/submission.json``
            alone records the protocol.

    Under ``torchrun`` every rank joins the process group, predicts and scores its share and returns the scores of
    the whole split; rank 0 alone writes ``metrics.json`` (with ``format_only``: the archive and ``submission.json``,
    once every rank has copied its share of the masks), once every rank's masks are written. The model is the
    checkpoint's: where the model settings of ``cfg`` differ from its, a warning on stderr names them
    (:func:`wsss.model_file.model_settings_warning`).

    Raises:
        FileNotFoundError: The checkpoint, the dataset root, the split or the mask folder is missing.
        ValueError: The checkpoint's classes differ from the config's, the masks do not fit them, an output
            folder could overwrite the dataset, or ``format_only`` without ``out``.
        OutputError: An output could not be written (one line naming it).
    """
    dist_info = init_distributed(str(device))
    device = dist_info.device if dist_info.enabled else device
    progress = progress and dist_info.is_main
    root = Path(cfg.data.root)
    classes = config_classes(cfg.data)
    split = split or cfg.data.val_split
    if format_only and out is None:
        raise ValueError("--format-only writes the server's layout and archive under --out DIR: give --out")
    model_file = read_model_file(checkpoint)
    trained = list(model_file["classes"])
    if trained != classes:
        raise ValueError(
            f"{checkpoint} was trained on classes {trained}, the config names {classes}: "
            "evaluate with the config the checkpoint was trained with"
        )
    warning = model_settings_warning(cfg, model_file, checkpoint)
    if warning and dist_info.is_main:
        print(warning, file=sys.stderr)
    for folder in (run_dir, out):
        if folder is not None:
            OutputLayout(folder).check_input(root)
    predicted = Path(show_dir or out or run_dir)  # the run folder holds masks only without --out and --show-dir
    options = InferenceOptions(
        scales=cfg.infer.scales if tta else (1.0,), flip=cfg.infer.flip and tta, crf=crf, gallery=show_dir is not None,
        overwrite=True, progress=progress, cfg_options={f"infer.{k}": v for k, v in to_dict(cfg)["infer"].items()},
        num_workers=cfg.data.num_workers, threads=torch.get_num_threads(),  # as set for the config's processes
    )  # fmt: skip
    summary = run_inference(checkpoint, root, predicted, split, options, device)
    ids = read_split(resolve_split(root, split))
    masks = predicted / "masks"
    protocol = EvalProtocol(
        checkpoint=str(checkpoint), step=model_file.get("step"), split=split, num_images=len(ids),
        split_images=len(ids), val_split=cfg.data.val_split, voc=is_voc(classes), scored=not format_only,
        **_inference_settings(predicted),
    )  # fmt: skip
    gallery = predicted / "index.html" if show_dir is not None else None
    if format_only:
        submission = _submit(masks, Path(out), ids, protocol, Path(run_dir) / "submission.json")
        return SplitEvaluation(None, summary, Path(run_dir) / "submission.json", masks, gallery, protocol, submission)
    metrics = score_masks(masks, root / cfg.data.mask_dir, ids, classes, cfg.data.ignore_index, device,
                          cfg.data.num_workers, progress)  # fmt: skip
    if out is not None and Path(out) != predicted:
        masks = copy_masks(predicted, Path(out), ids[dist_info.rank :: dist_info.world_size])
        barrier()  # every rank's share copied
    metrics_file = Path(run_dir) / "metrics.json"
    if dist_info.is_main:
        with writing(metrics_file):
            save_metrics_json(metrics, metrics_file, checkpoint=str(checkpoint), split=split, tta=tta,
                              crf=crf, predictions=str(masks), protocol=protocol.to_dict())  # fmt: skip
    return SplitEvaluation(metrics, summary, metrics_file, masks, gallery, protocol)


def _inference_settings(predicted: Path) -> dict[str, Any]:
    """The protocol's inference settings as the run recorded them in ``run.json`` (written before any mask)."""
    run = json.loads((predicted / "run.json").read_text())
    return {"scales": tuple(run["scales"]), "flip": run["flip"], "crf": run["crf"], "mask_classes": run["mask_classes"],
            "max_size": run["max_size"], "fp32_precision": run.get("fp32_precision"),
            "dtype": run.get("dtype", LATER_SETTINGS["dtype"])}  # fmt: skip


def _submit(masks: Path, out: Path, ids: list[str], protocol: EvalProtocol, record: Path) -> Submission:
    """Every rank copies its share of the masks into the server's layout; then rank 0 packs the archive and writes
    ``record`` (the protocol, the archive and its folder)."""
    rank, world = rank_and_world()
    failure = None
    try:
        folder = write_submission(masks, out, ids, rank, world)
    except OSError as err:
        failure = err
    failures = [m for m in all_gather_objects(None if failure is None else str(failure)) if m]
    if failure is not None:
        raise failure
    if failures:  # another rank's share failed: every rank stops, none waits for the archive
        raise OSError(failures[0])
    submission = Submission(folder, out / ARCHIVE_NAME, len(ids), protocol.voc)
    try:
        if rank == 0:
            write_archive(out, ids)
            with writing(record):
                info = {"protocol": protocol.to_dict(), "archive": str(submission.archive), "folder": str(folder)}
                atomic_write_text(record, json.dumps(info, indent=2) + "\n")
    finally:
        barrier()
    return submission


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
        src, dst = (OutputLayout(folder).paths(image_id)["masks"] for folder in (source, target))
        if src.is_file():
            with writing(dst):
                atomic_write_bytes(dst, src.read_bytes())
    return target / "masks"
