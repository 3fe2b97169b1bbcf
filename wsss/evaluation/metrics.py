"""Semantic segmentation metrics from one confusion matrix (validation, pseudo-label scoring, tools/eval.py).

The numbers and keys are those of mmseg's ``IoUMetric``: ``aAcc``, ``mIoU``, ``mAcc`` (and ``mDice``,
``mFscore``, ``mPrecision``, ``mRecall`` on request), in percent rounded to 2 decimals, per-class values
NaN for classes absent from both prediction and ground truth, means taken with ``nanmean``.

Counting convention (``ConfusionMatrix.counts``, shape (C + 2, C + 1), int64):
    rows 0..C-1 are ground-truth classes, row C counts ground-truth pixels with a label outside [0, C) that
    is not ``ignore_index`` (skipped, as the design asks: only pixels with gt in [0, C) are scored), row
    C + 1 counts ignored pixels; columns 0..C-1 are predicted classes, column C counts predictions outside
    [0, C), which are misses of their ground-truth class (as in mmseg) but no class's false positive.

One deliberate difference from mmseg: mmseg counts the prediction at a pixel whose label is out of range
(neither ignored nor in [0, C)) as a false positive of the predicted class; here such pixels are left out
entirely. On masks whose labels are all in [0, C) or ``ignore_index`` the two agree.

Scoring folders of masks: :mod:`wsss.evaluation.folders`. The mmengine metric for mmseg configs
(``WSSSIoUMetric``) lives in :mod:`wsss.evaluation.mmseg_metric`, which imports mmseg.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from wsss.evaluation.constants import METRICS
from wsss.utils.distributed import collective


@dataclass
class SegMetrics:
    """Result of :meth:`ConfusionMatrix.compute`.

    Attributes:
        summary: mmseg ``IoUMetric`` keys -> percent, e.g. ``{"aAcc": 93.1, "mIoU": 72.5, "mAcc": 80.2}``.
        per_class: ``"IoU"``, ``"Acc"`` (``"Dice"``, ``"Fscore"``, ``"Precision"``, ``"Recall"``) -> (C,)
            float64 percent, NaN where the class is absent.
        class_names: C names, in class-index order.
    """

    summary: dict[str, float]
    per_class: dict[str, np.ndarray]
    class_names: list[str] = field(default_factory=list)

    def __getitem__(self, key: str) -> float:
        """``result["mIoU"]``: a summary value."""
        return self.summary[key]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the summary keys, then ``per_class`` as {metric: {class: value}}; NaN -> None."""
        out: dict[str, Any] = {k: _json_float(v) for k, v in self.summary.items()}
        out["per_class"] = {
            key: {name: _json_float(v) for name, v in zip(self.class_names, values, strict=True)}
            for key, values in self.per_class.items()
        }
        return out


def _json_float(value: float) -> float | None:
    return None if math.isnan(value) else float(value)


class ConfusionMatrix:
    """Pixel confusion matrix of integer label maps, accumulated with ``torch.bincount`` (int64).

    Args:
        num_classes: C, the number of classes (background included); valid labels are 0..C-1.
        ignore_index: Ground-truth label that is not scored.
        reduce_zero_label: Apply mmseg's ``reduce_zero_label`` to the ground truth: label 0 becomes ignored
            and every other label is decreased by one (``ignore_index`` stays ignored). Predictions are
            taken as already in the reduced label space, as a model with C outputs writes them.
        device: Where counts accumulate. None: on the device of the first prediction passed to
            :meth:`update`; later inputs are moved there.

    Counting is one ``bincount`` per pair over ``row * (C + 1) + column``: ``torch.bincount`` on the
    accumulation device, except on the CPU, where the same arithmetic runs in numpy. numpy's kernels are
    single-threaded; torch's CPU kernels parallelise every op of a 500x375 pair over the intra-op pool,
    which took 4-45 ms instead of 1 ms per pair when the cores were shared (decoding threads, other jobs).

    Example:
        >>> cm = ConfusionMatrix(21)
        >>> for pred, gt in pairs:          # (H, W) tensors or arrays, any integer dtype
        ...     cm.update(pred, gt)
        >>> cm.all_reduce()                 # no-op unless torch.distributed is initialised
        >>> print(format_table(cm.compute(class_names=VOC_CLASSES)))
    """

    def __init__(
        self,
        num_classes: int,
        ignore_index: int = 255,
        reduce_zero_label: bool = False,
        device: str | torch.device | None = None,
    ) -> None:
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")
        self.num_classes = int(num_classes)
        self.ignore_index = int(ignore_index)
        self.reduce_zero_label = bool(reduce_zero_label)
        self._device = torch.device(device) if device is not None else None
        self.counts = torch.zeros(
            (num_classes + 2, num_classes + 1), dtype=torch.int64, device=self._device or "cpu"
        )

    @property
    def matrix(self) -> torch.Tensor:
        """(C, C) int64: ``matrix[i, j]`` = pixels of ground-truth class i predicted as class j."""
        return self.counts[: self.num_classes, : self.num_classes]

    @property
    def num_out_of_range(self) -> int:
        """Ground-truth pixels skipped because their label is outside [0, C) and not ignored."""
        return int(self.counts[self.num_classes].sum())

    @property
    def num_ignored(self) -> int:
        """Ground-truth pixels equal to ``ignore_index`` (or 0 with ``reduce_zero_label``)."""
        return int(self.counts[self.num_classes + 1].sum())

    def reset(self) -> None:
        """Zero the counts."""
        self.counts.zero_()

    def count(self, pred: torch.Tensor | np.ndarray, gt: torch.Tensor | np.ndarray) -> torch.Tensor:
        """Counts of one prediction/ground-truth pair, without accumulating them.

        Args:
            pred: Predicted labels, any shape, integer dtype.
            gt: Ground-truth labels with the same shape (size-1 dimensions aside), integer dtype.

        Returns:
            (C + 2, C + 1) int64 counts, laid out as :attr:`counts`, on the accumulation device.

        Raises:
            TypeError: A non-integer input (e.g. logits instead of labels).
            ValueError: The shapes differ.
        """
        if self._device is None:
            self._device = pred.device if isinstance(pred, torch.Tensor) else torch.device("cpu")
            self.counts = self.counts.to(self._device)
        c, args = self.num_classes, (self.num_classes, self.ignore_index, self.reduce_zero_label)
        if self._device.type == "cpu":
            # numpy on CPU: single-threaded kernels, so no stalls from an oversubscribed torch thread pool
            # (decoding threads, other processes); about 1 ms for a 500x375 pair.
            p, g = _as_label_array(pred, "pred"), _as_label_array(gt, "gt")
            _check_shapes(p.shape, g.shape)
            counts = torch.from_numpy(_count_numpy(p.reshape(-1), g.reshape(-1), *args))
        else:
            p, g = _as_label_tensor(pred, "pred"), _as_label_tensor(gt, "gt")
            _check_shapes(p.shape, g.shape)
            counts = _count_torch(p.to(self._device).reshape(-1), g.to(self._device).reshape(-1), *args)
        return counts.view(c + 2, c + 1)

    def update(self, pred: torch.Tensor | np.ndarray, gt: torch.Tensor | np.ndarray) -> None:
        """Accumulate one pair (see :meth:`count` for the arguments)."""
        counts = self.count(pred, gt)  # first: it moves ``self.counts`` to the device of the first prediction
        self.counts += counts

    def merge(self, other: ConfusionMatrix | torch.Tensor) -> ConfusionMatrix:
        """Add another matrix's counts (or a (C + 2, C + 1) counts tensor, dense or sparse) in place."""
        counts = other.counts if isinstance(other, ConfusionMatrix) else other
        if counts.shape != self.counts.shape:
            raise ValueError(f"cannot merge counts {tuple(counts.shape)} into {tuple(self.counts.shape)}")
        if counts.is_sparse:
            counts = counts.to_dense()
        self.counts += counts.to(self.counts.device, torch.int64)
        return self

    def all_reduce(self) -> ConfusionMatrix:
        """Sum the counts over all ranks in place when ``torch.distributed`` is initialised; else a no-op.

        Every rank must call it. Note that samplers which pad the dataset to equal shards (mmengine's
        DefaultSampler, torch's DistributedSampler) score the padded duplicates twice; shard without
        padding, or use :class:`wsss.evaluation.mmseg_metric.WSSSIoUMetric` under an mmengine runner.
        """
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return self
        counts = self.counts
        if dist.get_backend() == "nccl" and counts.device.type != "cuda":
            counts = counts.cuda()
        with collective("the confusion matrices' all-reduce"):
            dist.all_reduce(counts, op=dist.ReduceOp.SUM)
        self.counts.copy_(counts)
        return self

    def compute(
        self,
        metrics: str | Sequence[str] = ("mIoU",),
        beta: float = 1,
        nan_to_num: float | None = None,
        decimals: int | None = 2,
        class_names: Sequence[str] | None = None,
    ) -> SegMetrics:
        """The metrics of mmseg's ``IoUMetric`` from the accumulated counts.

        Args:
            metrics: Any of ``"mIoU"`` (IoU, Acc), ``"mDice"`` (Dice, Acc), ``"mFscore"`` (Fscore, Precision,
                Recall). ``aAcc`` is always included.
            beta: Weight of recall in the F-score.
            nan_to_num: If given, per-class NaNs are replaced by it before the means (as in mmseg).
            decimals: Rounding of the percentages (mmseg: 2); None keeps full precision.
            class_names: C names for the table; default ``"0"``..``"C-1"``.

        Returns:
            The summary and per-class values in percent.
        """
        metrics = [metrics] if isinstance(metrics, str) else list(metrics)
        unknown = [m for m in metrics if m not in METRICS]
        if unknown:
            raise KeyError(f"unknown metrics {unknown}; valid: {list(METRICS)}")
        names = [str(i) for i in range(self.num_classes)] if class_names is None else list(class_names)
        if len(names) != self.num_classes:
            raise ValueError(f"{len(names)} class names for {self.num_classes} classes")

        counts = self.counts.cpu().numpy().astype(np.float64)
        c = self.num_classes
        tp = np.diag(counts[:c, :c])
        gt_area = counts[:c].sum(axis=1)
        pred_area = counts[:c, :c].sum(axis=0)
        values: dict[str, np.ndarray] = {}
        with np.errstate(divide="ignore", invalid="ignore"):
            values["aAcc"] = np.asarray(tp.sum() / gt_area.sum())
            for metric in metrics:
                if metric == "mIoU":
                    values["IoU"] = tp / (gt_area + pred_area - tp)
                    values["Acc"] = tp / gt_area
                elif metric == "mDice":
                    values["Dice"] = 2 * tp / (gt_area + pred_area)
                    values["Acc"] = tp / gt_area
                else:
                    precision, recall = tp / pred_area, tp / gt_area
                    values["Fscore"] = (1 + beta**2) * precision * recall / (beta**2 * precision + recall)
                    values["Precision"] = precision
                    values["Recall"] = recall
        if nan_to_num is not None:
            values = {k: np.nan_to_num(v, nan=nan_to_num) for k, v in values.items()}

        def percent(x: np.ndarray | float) -> Any:
            x = np.asarray(x, dtype=np.float64) * 100
            return x if decimals is None else np.round(x, decimals)

        summary = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # nanmean of all-NaN -> NaN, as in mmseg
            for key, value in values.items():
                summary[key if key == "aAcc" else "m" + key] = float(percent(np.nanmean(value)))
        per_class = {k: percent(v) for k, v in values.items() if k != "aAcc"}
        return SegMetrics(summary=summary, per_class=per_class, class_names=names)


def _check_shapes(pred_shape: tuple[int, ...], gt_shape: tuple[int, ...]) -> None:
    squeeze = [tuple(d for d in shape if d != 1) for shape in (pred_shape, gt_shape)]
    if tuple(pred_shape) != tuple(gt_shape) and squeeze[0] != squeeze[1]:
        raise ValueError(f"prediction shape {tuple(pred_shape)} != ground-truth shape {tuple(gt_shape)}")


def _as_label_array(x: torch.Tensor | np.ndarray, name: str) -> np.ndarray:
    """A numpy array of integer labels (a CPU view of a tensor when possible)."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        x = x.to(torch.uint8) if x.dtype == torch.bool else x
        if x.is_floating_point() or x.is_complex():
            raise TypeError(f"{name}: expected integer labels, got a {x.dtype} tensor (argmax the logits)")
        return x.numpy()
    x = np.asarray(x)
    if x.dtype == np.bool_:
        return x.view(np.uint8)
    if not np.issubdtype(x.dtype, np.integer):
        raise TypeError(f"{name}: expected integer labels, got a {x.dtype} array")
    return x


def _as_label_tensor(x: torch.Tensor | np.ndarray, name: str) -> torch.Tensor:
    """A tensor of integer labels in a dtype that the clamp/compare kernels support."""
    if not isinstance(x, torch.Tensor):
        x = _as_label_array(x, name)
        if x.dtype.kind == "u" and x.dtype.itemsize > 1:
            x = x.astype(np.int64)
        x = torch.from_numpy(np.ascontiguousarray(x))
    if x.dtype == torch.bool:
        x = x.to(torch.uint8)
    if x.is_floating_point() or x.is_complex():
        raise TypeError(f"{name}: expected integer labels, got a {x.dtype} tensor (argmax the logits)")
    if x.dtype in (torch.uint16, torch.uint32, torch.uint64):
        x = x.to(torch.int64)
    return x


def _count_numpy(
    pred: np.ndarray, gt: np.ndarray, num_classes: int, ignore_index: int, reduce_zero_label: bool
) -> np.ndarray:
    """Flat ((C + 2) * (C + 1),) int64 counts of 1-D label arrays, laid out as ``ConfusionMatrix.counts``."""
    c = num_classes
    info = np.iinfo(gt.dtype)
    ignored = gt == ignore_index if info.min <= ignore_index <= info.max else np.zeros(gt.shape, bool)
    if reduce_zero_label:
        ignored |= gt == 0
        rows = _clip_labels_numpy(gt, c + 1)
        rows -= 1  # 1..C -> 0..C-1; C+1 (out of range) -> C
    else:
        rows = _clip_labels_numpy(gt, c)
    rows[ignored] = c + 1
    rows *= c + 1
    rows += _clip_labels_numpy(pred, c)
    return np.bincount(rows, minlength=(c + 2) * (c + 1)).astype(np.int64, copy=False)


def _clip_labels_numpy(x: np.ndarray, hi: int) -> np.ndarray:
    """int32 copy of ``x`` with values outside [0, hi) replaced by ``hi``."""
    info = np.iinfo(x.dtype)
    if info.min < 0:
        x = (np.clip(x, -1, hi) if hi < info.max else np.maximum(x, -1)).astype(np.int32)
        x[x < 0] = hi
        return x
    return (np.minimum(x, hi) if hi < info.max else x).astype(np.int32)


def _count_torch(
    pred: torch.Tensor, gt: torch.Tensor, num_classes: int, ignore_index: int, reduce_zero_label: bool
) -> torch.Tensor:
    """:func:`_count_numpy` with torch ops, on the tensors' device (used off the CPU). The counts are added into bins
    of a size known beforehand (``index_add_``), where ``bincount`` reads the index's maximum back to the host (a
    CUDA sync per update)."""
    c = num_classes
    info = torch.iinfo(gt.dtype)
    ignored = (
        gt == ignore_index if info.min <= ignore_index <= info.max else torch.zeros_like(gt, dtype=torch.bool)
    )
    if reduce_zero_label:
        ignored |= gt == 0
        rows = _clip_labels_torch(gt, c + 1).sub_(1)
    else:
        rows = _clip_labels_torch(gt, c)
    rows.masked_fill_(ignored, c + 1)
    index = rows.mul_(c + 1).add_(_clip_labels_torch(pred, c)).reshape(-1)
    counts = torch.zeros((c + 2) * (c + 1), dtype=torch.int64, device=index.device)
    return counts.index_add_(0, index, torch.ones_like(index, dtype=torch.int64))


def _clip_labels_torch(x: torch.Tensor, hi: int) -> torch.Tensor:
    """int32 copy of ``x`` with values outside [0, hi) replaced by ``hi``."""
    info = torch.iinfo(x.dtype)
    if info.min < 0:
        x = (x.clamp(-1, hi) if hi < info.max else x.clamp_min(-1)).to(torch.int32)
        return x.masked_fill_(x < 0, hi)
    return (x.clamp_max(hi) if hi < info.max else x).to(torch.int32)


def format_table(result: SegMetrics, digits: int = 2, title: str | None = None) -> str:
    """Per-class table (one column per per-class metric) followed by a one-row summary table.

    Args:
        result: What :meth:`ConfusionMatrix.compute` returned.
        digits: Decimals shown.
        title: Optional first line.

    Example output::

        +------------+-------+-------+
        | Class      |   IoU |   Acc |
        +------------+-------+-------+
        | background | 91.20 | 95.01 |
        | aeroplane  |   nan |   nan |
        +------------+-------+-------+
        +-------+-------+-------+
        |  aAcc |  mIoU |  mAcc |
        +-------+-------+-------+
        | 93.10 | 45.60 | 47.50 |
        +-------+-------+-------+
    """

    def fmt(v: float) -> str:
        return "nan" if math.isnan(v) else f"{v:.{digits}f}"

    keys = list(result.per_class)
    rows = [[name] + [fmt(result.per_class[k][i]) for k in keys] for i, name in enumerate(result.class_names)]
    summary = [[fmt(v) for v in result.summary.values()]]
    text = _grid(["Class", *keys], rows) + "\n" + _grid(list(result.summary), summary)
    return text if title is None else f"{title}\n{text}"


def _grid(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def line(cells: list[str], first_left: bool) -> str:
        out = [
            f" {c:<{w}} " if i == 0 and first_left else f" {c:>{w}} "
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "|" + "|".join(out) + "|"

    left = header[0] == "Class"
    return "\n".join([rule, line(header, left), rule, *(line(r, left) for r in rows), rule])
