"""Which checkpoints a run keeps: the newest ``train.max_keep_ckpts``, the best validated one and the last one.

The best one (highest ``val/seg_mIoU``; ``val/cls_mAP`` on a val set with tags only:
:func:`wsss.engine.validate.best_metric`) is named in ``work_dir/best_checkpoint.json``, so a resumed run keeps
tracking it. A paper-setting checkpoint is about 300 MB; without pruning an 80k-iteration run leaves 16.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from wsss.engine.checkpoint import LAST_CHECKPOINT
from wsss.model_file import CHECKSUM_SUFFIX, checksum_path
from wsss.utils.fileio import atomic_write_text

BEST_FILE = "best_checkpoint.json"
_ITER = re.compile(r"iter_(\d+)\.pth")


class CheckpointKeeper:
    """Tracks the best validated step and deletes the checkpoints a run no longer keeps.

    Args:
        work: The work dir.
        max_keep: How many of the newest ``iter_*.pth`` to keep besides the best and the last; -1 keeps all.
        start: The iteration the run starts from; a best record from a later step (an abandoned run) or of another
            metric is ignored.
        metric: The validation metric (a key of :attr:`wsss.engine.validate.ValResult.metrics`) whose highest value
            is the best.
        writes: Whether this process writes and deletes files (rank 0). Every rank tracks the best step, so all
            agree on when to save.
    """

    def __init__(self, work: Path, max_keep: int, start: int, metric: str, writes: bool = True) -> None:
        self.work, self.max_keep, self.metric, self.writes = work, max_keep, metric, writes
        self.best: dict | None = None
        try:
            best = json.loads((work / BEST_FILE).read_text())
            if int(best["step"]) <= start and metric in best:
                self.best = best
        except (OSError, ValueError, KeyError, TypeError):
            pass

    def is_best(self, metrics: dict[str, float]) -> bool:
        """Whether ``metrics`` beat the best validation so far."""
        value = metrics.get(self.metric, math.nan)
        return math.isfinite(value) and (self.best is None or value > self.best[self.metric])

    def mark_best(self, step: int, checkpoint: Path, metrics: dict[str, float]) -> None:
        """Record ``checkpoint`` (saved at ``step``) as the best one."""
        self.best = {"step": step, "checkpoint": checkpoint.name, self.metric: metrics[self.metric]}
        if self.writes:
            atomic_write_text(self.work / BEST_FILE, json.dumps(self.best, indent=2) + "\n")

    def prune(self) -> list[Path]:
        """Delete the ``iter_*.pth`` that are neither among the newest ``max_keep``, the best, nor the last one,
        each with its ``.sha256``, and every ``iter_*.pth.sha256`` whose checkpoint is gone; returns the deleted
        checkpoints."""
        if self.max_keep < 0 or not self.writes:
            return []
        found = sorted((int(m.group(1)), p) for p in self.work.glob("iter_*.pth") if (m := _ITER.fullmatch(p.name)))
        keep = {p.name for _, p in found[max(0, len(found) - self.max_keep) :]}
        if self.best is not None:
            keep.add(self.best["checkpoint"])
        marker = self.work / LAST_CHECKPOINT
        if marker.is_file():
            keep.add(marker.read_text().strip())
        removed = [p for _, p in found if p.name not in keep]
        for path in removed:
            path.unlink(missing_ok=True)
            checksum_path(path).unlink(missing_ok=True)
        for orphan in self.work.glob(f"iter_*.pth{CHECKSUM_SUFFIX}"):
            checkpoint = orphan.with_name(orphan.name.removesuffix(CHECKSUM_SUFFIX))
            if _ITER.fullmatch(checkpoint.name) and not checkpoint.exists():
                orphan.unlink(missing_ok=True)
        return removed
