"""Multi-label classification scores from image-level tags: what validation reports when there are no masks.

mAP is the mean over classes of the average precision (the mean of the precision at the rank of each
positive image, ties broken by order); F1 is the macro F1 at a probability threshold. Both average only over
the classes that have at least one positive image, and are in percent.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["average_precision", "multilabel_scores"]


def average_precision(scores: np.ndarray, targets: np.ndarray) -> float:
    """AP of one class: (N,) scores, (N,) 0/1 targets with at least one positive."""
    order = np.argsort(-scores, kind="stable")
    hits = targets[order].astype(np.float64)
    precision = np.cumsum(hits) / np.arange(1, len(hits) + 1)
    return float((precision * hits).sum() / hits.sum())


def multilabel_scores(
    probs: np.ndarray, targets: np.ndarray, threshold: float, names: Sequence[str] | None = None
) -> dict[str, float]:
    """``{"cls_mAP", "cls_F1"}`` in percent (NaN when no class has a positive image); with ``names`` also
    ``"AP_<name>"`` for each class that has a positive image.

    Args:
        probs: (N, K) class probabilities (sigmoid of the classifier logits).
        targets: (N, K) 0/1 image-level labels.
        threshold: A class is predicted present above this probability (F1).
        names: The K class names.
    """
    targets = targets.astype(bool)
    classes = np.flatnonzero(targets.any(axis=0))
    if classes.size == 0:
        return {"cls_mAP": float("nan"), "cls_F1": float("nan")}
    ap = [average_precision(probs[:, k], targets[:, k]) for k in classes]
    pred = probs[:, classes] > threshold
    truth = targets[:, classes]
    tp = (pred & truth).sum(axis=0)
    f1 = 2 * tp / (pred.sum(axis=0) + truth.sum(axis=0))
    scores = {"cls_mAP": 100.0 * float(np.mean(ap)), "cls_F1": 100.0 * float(np.mean(f1))}
    if names is not None:
        scores.update({f"AP_{names[k]}": 100.0 * a for k, a in zip(classes, ap, strict=True)})
    return scores
