"""Scoring folders of predicted label masks against ground-truth masks (``tools/eval.py``).

Masks are matched by their path relative to each folder, without extension, decoded in threads and counted
with one :class:`wsss.evaluation.metrics.ConfusionMatrix`. :func:`evaluate_folders` scores every pixel whose ground
truth is a class; :func:`evaluate_certain_pixels` leaves out the pixels a prediction marks uncertain (the ignore
index, as in exported pseudo labels) and counts them (``tools/eval_cams.py``'s "certain pixels only").
"""

from __future__ import annotations

import json
import sys
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from wsss.evaluation.metrics import ConfusionMatrix, SegMetrics
from wsss.utils.fileio import atomic_write_text, read_mask

MASK_EXTENSIONS = (".png", ".bmp", ".tif", ".tiff", ".pgm")


def index_masks(root: str | Path) -> dict[str, Path]:
    """Mask files under ``root`` (recursive), keyed by relative POSIX path without extension.

    Raises:
        FileNotFoundError: ``root`` is not a folder.
        ValueError: Two files differ only by extension (``a/x.png`` and ``a/x.bmp``).
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"not a folder: {root}")
    found: dict[str, Path] = {}
    for path in sorted(root.rglob("*")):
        if path.suffix.lower() not in MASK_EXTENSIONS or path.name.startswith(".") or not path.is_file():
            continue
        key = path.relative_to(root).with_suffix("").as_posix()
        if key in found:
            raise ValueError(f"two masks for the same name {key!r}: {found[key]} and {path}")
        found[key] = path
    return found


def _load_pair(key: str, pred_path: Path, gt_path: Path) -> tuple[str, np.ndarray, np.ndarray]:
    pred, gt = read_mask(pred_path), read_mask(gt_path)
    if pred.shape != gt.shape:
        raise ValueError(
            f"size mismatch for {key!r}: prediction {pred_path} is {pred.shape[1]}x{pred.shape[0]}, "
            f"ground truth {gt_path} is {gt.shape[1]}x{gt.shape[0]} (width x height)"
        )
    return key, pred, gt


def iter_mask_pairs(
    pairs: Iterable[tuple[str, Path, Path]], num_workers: int
) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
    """Read ``(key, pred_path, gt_path)`` mask pairs as ``(key, pred, gt)`` (H, W) uint8, in order.

    Decoding runs in ``num_workers`` threads (PNG decoding releases the GIL), at most two pairs per worker
    ahead of the consumer; 0 decodes in the calling thread.

    Raises:
        ValueError: A mask is unreadable, or a prediction and its ground truth differ in size (names both).
    """
    if num_workers <= 0:
        yield from (_load_pair(*p) for p in pairs)
        return
    pairs = iter(pairs)
    pool = ThreadPoolExecutor(num_workers, thread_name_prefix="eval-decode")
    try:
        pending = deque(pool.submit(_load_pair, *p) for p in islice(pairs, 2 * num_workers))
        while pending:
            result = pending.popleft().result()
            nxt = next(pairs, None)
            if nxt is not None:
                pending.append(pool.submit(_load_pair, *nxt))
            yield result
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def evaluate_folders(
    pred_dir: str | Path,
    gt_dir: str | Path,
    num_classes: int,
    *,
    class_names: Sequence[str] | None = None,
    ids: Sequence[str] | None = None,
    ignore_index: int = 255,
    reduce_zero_label: bool = False,
    metrics: Sequence[str] = ("mIoU",),
    device: str | torch.device = "cpu",
    num_workers: int = 4,
    progress: bool = False,
) -> SegMetrics:
    """Score a folder of predicted label PNGs against a folder of ground-truth label PNGs.

    Files are matched by their path relative to each folder, without extension (recursive), so
    ``pred/2007_000033.png`` scores ``gt/2007_000033.png`` and ``pred/a/b.png`` scores ``gt/a/b.bmp``.
    Every ground-truth mask (or every one named in ``ids``) must have a prediction; extra predictions
    are not scored.

    Args:
        pred_dir: Predicted index masks, values 0..C-1; others count as misses, which lowers every metric, and
            are warned about on stderr with their number and the first file (a wrong ``num_classes``, or masks
            from a model with more classes).
        gt_dir: Ground-truth index masks, values 0..C-1 or ``ignore_index``.
        num_classes: C.
        class_names: C names for the result; default ``"0"``..``"C-1"``.
        ids: Restrict to these names (relative paths without extension), e.g. the lines of ``val.txt``.
        ignore_index: Ground-truth label that is not scored.
        reduce_zero_label: See :class:`ConfusionMatrix`.
        metrics: See :meth:`ConfusionMatrix.compute`.
        device: Where the confusion matrix is counted.
        num_workers: Decoding threads (0: decode in the calling thread).
        progress: Show a tqdm progress bar.

    Raises:
        ValueError: No ground truth, predictions missing, a size mismatch, or ground-truth labels outside
            [0, C) that are not ignored (a wrong ``num_classes``); the message names the files.
    """
    options = dict(class_names=class_names, ids=ids, ignore_index=ignore_index, reduce_zero_label=reduce_zero_label,
                   metrics=metrics, device=device, num_workers=num_workers, progress=progress)  # fmt: skip
    return _score_folders(pred_dir, gt_dir, num_classes, certain_only=False, **options).metrics


@dataclass
class CertainPixels:
    """Result of :func:`evaluate_certain_pixels`.

    Attributes:
        metrics: The scores of the certain pixels.
        uncertain: Scored pixels (ground truth in [0, C)) that the predictions mark uncertain, left out of ``metrics``.
        scored: Pixels whose ground truth is in [0, C), certain or not.
    """

    metrics: SegMetrics
    uncertain: int
    scored: int

    @property
    def uncertain_fraction(self) -> float:
        """``uncertain / scored`` (NaN when nothing is scored)."""
        return self.uncertain / self.scored if self.scored else float("nan")


def evaluate_certain_pixels(
    pred_dir: str | Path, gt_dir: str | Path, num_classes: int, **options: Any
) -> CertainPixels:
    """:func:`evaluate_folders` (the same arguments) on the certain pixels only: a pixel predicted ``ignore_index``
    (uncertain, as in exported pseudo labels) is not scored, and counts in :attr:`CertainPixels.uncertain` when its
    ground truth is a class. Not comparable with published tables, which score every pixel.

    Raises:
        ValueError: As :func:`evaluate_folders`, or ``ignore_index`` is a class (< C), so uncertain is a class.
    """
    ignore_index = options.get("ignore_index", 255)
    if ignore_index < num_classes:
        raise ValueError(
            f"--certain-only: the uncertain value (--ignore-index {ignore_index}) is one of the {num_classes} classes; "
            "give the value the predictions mark uncertain pixels with (255)"
        )
    return _score_folders(pred_dir, gt_dir, num_classes, certain_only=True, **options)


def _score_folders(
    pred_dir: str | Path,
    gt_dir: str | Path,
    num_classes: int,
    *,
    certain_only: bool,
    class_names: Sequence[str] | None = None,
    ids: Sequence[str] | None = None,
    ignore_index: int = 255,
    reduce_zero_label: bool = False,
    metrics: Sequence[str] = ("mIoU",),
    device: str | torch.device = "cpu",
    num_workers: int = 4,
    progress: bool = False,
) -> CertainPixels:
    """The scores of :func:`evaluate_folders`; with ``certain_only`` those of :func:`evaluate_certain_pixels`."""
    gts, preds = index_masks(gt_dir), index_masks(pred_dir)
    if ids is not None:
        ids = [_strip_mask_suffix(i.strip()) for i in ids if i.strip()]
        absent = [i for i in ids if i not in gts]
        if absent:
            raise ValueError(
                f"{len(absent)} of {len(ids)} listed ids have no ground truth in {gt_dir}: {_some(absent)}"
            )
        gts = {i: gts[i] for i in ids}
    if not gts:
        raise ValueError(f"no ground-truth masks ({', '.join(MASK_EXTENSIONS)}) found in {gt_dir}")
    missing = [k for k in gts if k not in preds]
    if missing:
        raise ValueError(
            f"{len(missing)} of {len(gts)} ground-truth masks have no prediction in {pred_dir}: "
            f"{_some(missing)} (to score a subset, list its names in ids / tools/eval.py --ids)"
        )

    cm = ConfusionMatrix(num_classes, ignore_index, reduce_zero_label, device=device)
    uncertain = scored = 0
    bad_gt: list[str] = []
    bad_pred: list[tuple[Path, int]] = []  # (mask, its predicted pixels outside [0, C))
    pairs = ((k, preds[k], gts[k]) for k in gts)
    loaded = iter_mask_pairs(pairs, num_workers)
    if progress:
        loaded = tqdm(loaded, total=len(gts), desc="eval", unit="img")
    for key, pred, gt in loaded:
        counts = cm.count(pred, gt)
        if counts[num_classes].any():
            values = np.unique(gt[~np.isin(gt, [*range(num_classes + reduce_zero_label), ignore_index])])
            bad_gt.append(f"{gts[key]} (labels {values.tolist()})")
        outside = int(counts[:, num_classes].sum())
        if certain_only:  # pixels predicted ignore_index: not scored, counted where their ground truth is a class
            marked = pred == ignore_index
            certain = cm.count(pred, np.where(marked, ignore_index, gt))
            scored += int(counts[:num_classes].sum())
            uncertain += int(counts[:num_classes].sum() - certain[:num_classes].sum())
            outside -= int(marked.sum())
            counts = certain
        if outside:
            bad_pred.append((preds[key], outside))
        cm.merge(counts)
    if bad_gt:
        raise ValueError(
            f"{len(bad_gt)} ground-truth masks have labels outside [0, {num_classes}) other than "
            f"{ignore_index}; is the number of classes right? {_some(bad_gt)}"
        )
    if bad_pred:
        print(
            f"warning: {sum(n for _, n in bad_pred)} predicted pixels in {len(bad_pred)} masks are outside [0, "
            f"{num_classes}) (first: {bad_pred[0][0]}); where the ground truth is scored they count as misses, "
            f"which lowers mIoU: are the predictions from a model of {num_classes} classes?",
            file=sys.stderr,
        )
    return CertainPixels(cm.compute(metrics, class_names=class_names), uncertain, scored)


def _strip_mask_suffix(name: str) -> str:
    path = Path(name)
    return path.with_suffix("").as_posix() if path.suffix.lower() in MASK_EXTENSIONS else path.as_posix()


def _some(items: Sequence[str], n: int = 5) -> str:
    head = ", ".join(str(i) for i in items[:n])
    return head + (f", ... ({len(items) - n} more)" if len(items) > n else "")


def classes_beside(pred_dir: str | Path) -> tuple[list[str], Path] | None:
    """The class list ``tools/infer.py`` wrote beside its masks: ``image_labels.json`` (``classes``) in the masks'
    folder or its parent; with the file it came from. None when there is none."""
    for folder in (Path(pred_dir), Path(pred_dir).parent):
        path = folder / "image_labels.json"
        try:
            classes = json.loads(path.read_text())["classes"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(classes, list) and len(classes) >= 2 and all(isinstance(c, str) for c in classes):
            return classes, path
    return None


def check_classes_seen(result: SegMetrics, source: str) -> None:
    """Refuse a class list longer than the masks: when the last classes appear in neither predictions nor ground
    truth, the names are likely another dataset's (e.g. VOC's 21 on a 7-class set).

    Raises:
        ValueError: The highest label in the masks is below the last class; the message says how to fix it.
    """
    seen = np.flatnonzero(~np.isnan(result.per_class["IoU"]))
    last = int(seen.max()) if seen.size else -1
    names = result.class_names
    if last < len(names) - 1:
        raise ValueError(
            f"the masks hold labels up to {last}, but {source} has {len(names)} classes ({', '.join(names[:3])}, "
            f"...): pass --classes FILE (one name per line, background first) or --num-classes {last + 1}"
        )


def save_metrics_json(result: SegMetrics, path: str | Path, **extra: Any) -> None:
    """Write :meth:`SegMetrics.to_dict` (plus ``extra`` keys) as JSON, atomically. NaN is written as null."""
    atomic_write_text(path, json.dumps({**result.to_dict(), **extra}, indent=2) + "\n")
