"""Score a checkpoint on a config's validation split (``tools/test.py``, mmseg's ``tools/test.py`` spelling).

The predictions come from :func:`wsss.inference.runner.run_inference` (the same masks ``tools/infer.py`` writes)
and are scored by :func:`wsss.evaluation.folders.evaluate_folders` (the same numbers ``tools/eval.py`` prints).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from wsss.config import Config
from wsss.data.voc import config_classes, read_split, resolve_split
from wsss.evaluation.folders import evaluate_folders, save_metrics_json
from wsss.evaluation.metrics import SegMetrics
from wsss.inference.predictor import read_model_file
from wsss.inference.runner import InferenceOptions, InferenceSummary, run_inference


@dataclass
class SplitEvaluation:
    """What :func:`evaluate_checkpoint` produced: the scores, the inference run, and where both are."""

    metrics: SegMetrics
    inference: InferenceSummary
    metrics_file: Path


def evaluate_checkpoint(
    cfg: Config,
    checkpoint: str | Path,
    output: str | Path,
    *,
    tta: bool = False,
    show: bool = False,
    device: str | torch.device = "cpu",
    progress: bool = True,
) -> SplitEvaluation:
    """Predict the masks of ``cfg.data.val_split`` with ``checkpoint`` and score them against ``cfg.data.mask_dir``.

    Args:
        cfg: The config that names the dataset (root, val split, mask folder, classes, ignore index) and, with
            ``tta``, the scales and flip (``infer.*``).
        checkpoint: A wsss checkpoint, or a ``tools/export.py --safetensors`` export.
        output: Folder of the predictions (``masks/``, with ``show`` also ``overlays/``, ``cams/`` and
            ``index.html``) and of ``metrics.json``.
        tta: Multi-scale + flip (``cfg.infer.scales``, ``cfg.infer.flip``); otherwise one scale, no flip.
        show: Also write the painted images and the gallery.
        device: Where the model runs and the confusion matrix is counted.
        progress: Progress bars.

    Raises:
        FileNotFoundError: The checkpoint, the dataset root, the split or the mask folder is missing.
        ValueError: The checkpoint's classes differ from the config's, or the masks do not fit them.
    """
    root = Path(cfg.data.root)
    classes = config_classes(cfg.data)
    trained = list(read_model_file(checkpoint)["classes"])
    if trained != classes:
        raise ValueError(
            f"{checkpoint} was trained on classes {trained}, the config names {classes}: "
            "evaluate with the config the checkpoint was trained with"
        )
    output = Path(output)
    options = InferenceOptions(
        scales=cfg.infer.scales if tta else (1.0,), flip=cfg.infer.flip and tta, gallery=show, progress=progress
    )
    summary = run_inference(checkpoint, root, output, cfg.data.val_split, options, device)
    ids = read_split(resolve_split(root, cfg.data.val_split))
    metrics = evaluate_folders(
        output / "masks", root / cfg.data.mask_dir, len(classes), class_names=classes, ids=ids,
        ignore_index=cfg.data.ignore_index, device=device, progress=progress,
    )  # fmt: skip
    metrics_file = output / "metrics.json"
    save_metrics_json(metrics, metrics_file, checkpoint=str(checkpoint), split=cfg.data.val_split, tta=tta)
    return SplitEvaluation(metrics, summary, metrics_file)
