"""Names the evaluation offers, without torch: tools/eval.py shows them in ``--help`` at once."""

METRICS = ("mIoU", "mDice", "mFscore")
"""Metric groups of :meth:`wsss.evaluation.metrics.ConfusionMatrix.compute`, as mmseg's ``IoUMetric`` names them."""
