"""``WSSSIoUMetric``: the wsss confusion matrix as an mmengine metric in mmseg's ``METRICS`` registry.

Importing this module imports mmseg and registers the metric in mmseg's registry and in mmengine's root one, so
``type="WSSSIoUMetric"`` resolves under ``default_scope="mmseg"`` and under mmengine's default scope alike;
:mod:`wsss.evaluation.metrics` itself never imports mmseg. From an mmseg or mmengine config::

    custom_imports = dict(imports=["wsss.evaluation.mmseg_metric"], allow_failed_imports=False)
    val_evaluator = dict(type="WSSSIoUMetric", iou_metrics=["mIoU"])

From Python, ``import wsss.evaluation.mmseg_metric`` does the same. With ``mmcv-lite`` (no compiled ops), the
mmseg scope's visualizer and hooks cannot be imported (``mmseg.utils`` needs ``mmcv.ops``): run such a Runner
in mmengine's default scope, as ``tests/evaluation/test_mmseg_runner.py`` does.
The arguments and returned keys are those of mmseg's ``IoUMetric``; the numbers agree with it (see the
one documented difference in :mod:`wsss.evaluation.metrics`).
"""

from __future__ import annotations

import os.path as osp
from collections.abc import Sequence

try:
    from mmengine.dist import is_main_process
    from mmengine.evaluator import BaseMetric
    from mmengine.logging import print_log
    from mmengine.registry import METRICS as MMENGINE_METRICS
    from mmseg.registry import METRICS
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"wsss.evaluation.mmseg_metric needs mmsegmentation 1.x and mmengine ({err}); "
        "install them with `pip install mmsegmentation mmengine mmcv-lite`"
    ) from err

from wsss.evaluation.metrics import ConfusionMatrix, format_table
from wsss.utils.fileio import save_mask


@MMENGINE_METRICS.register_module(force=True)
@METRICS.register_module(force=True)
class WSSSIoUMetric(BaseMetric):
    """mmseg ``IoUMetric`` computed with :class:`wsss.evaluation.metrics.ConfusionMatrix`.

    Per sample it keeps the sparse (C + 2, C + 1) counts, so mmengine's result collection drops the
    samples that distributed samplers pad in, exactly as for ``IoUMetric``.

    Args:
        ignore_index: Ground-truth label that is not scored.
        iou_metrics: Any of ``"mIoU"``, ``"mDice"``, ``"mFscore"``.
        nan_to_num: If given, per-class NaNs are replaced by it before the means.
        beta: Weight of recall in the F-score.
        collect_device: ``"cpu"`` or ``"gpu"``, for collecting results across ranks.
        output_dir: If given, each prediction is also written there as ``<image basename>.png``.
        format_only: Only write predictions (test sets without ground truth); no metrics.
        prefix: Prefix of the metric names in the returned dict.
        collect_dir: Folder for collecting results across ranks when ``collect_device`` is ``"cpu"``.
    """

    def __init__(
        self,
        ignore_index: int = 255,
        iou_metrics: Sequence[str] = ("mIoU",),
        nan_to_num: float | None = None,
        beta: float = 1,
        collect_device: str = "cpu",
        output_dir: str | None = None,
        format_only: bool = False,
        prefix: str | None = None,
        collect_dir: str | None = None,
    ) -> None:
        super().__init__(collect_device=collect_device, prefix=prefix, collect_dir=collect_dir)
        self.ignore_index = ignore_index
        self.metrics = [iou_metrics] if isinstance(iou_metrics, str) else list(iou_metrics)
        self.nan_to_num = nan_to_num
        self.beta = beta
        self.output_dir = output_dir
        self.format_only = format_only
        if format_only and output_dir is None:
            raise ValueError("format_only=True needs an output_dir to write the predictions to")

    def process(self, data_batch: dict, data_samples: Sequence[dict]) -> None:
        """Count each sample's ``pred_sem_seg`` against its ``gt_sem_seg``; write predictions if asked."""
        num_classes = len(self.dataset_meta["classes"])
        for sample in data_samples:
            pred = sample["pred_sem_seg"]["data"].squeeze()
            if not self.format_only:
                cm = ConfusionMatrix(num_classes, self.ignore_index, device=pred.device)
                counts = cm.count(pred, sample["gt_sem_seg"]["data"].squeeze())
                self.results.append(counts.cpu().to_sparse())
            if self.output_dir is not None:
                mask = pred.cpu().numpy()
                if sample.get("reduce_zero_label", False):
                    mask = mask + 1
                name = osp.splitext(osp.basename(sample["img_path"]))[0] + ".png"
                save_mask(osp.join(self.output_dir, name), mask)

    def compute_metrics(self, results: list) -> dict[str, float]:
        """Sum the per-sample counts; log the per-class table; return ``aAcc``, ``mIoU``, ... in percent."""
        if self.format_only:
            if is_main_process():
                print_log(f"predictions written to {self.output_dir}", logger="current")
            return {}
        class_names = list(self.dataset_meta["classes"])
        cm = ConfusionMatrix(len(class_names), self.ignore_index)
        for counts in results:
            cm.merge(counts)
        result = cm.compute(self.metrics, beta=self.beta, nan_to_num=self.nan_to_num, class_names=class_names)
        print_log("per class results:\n" + format_table(result), logger="current")
        return result.summary
