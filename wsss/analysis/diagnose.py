"""Per-layer oversmoothing diagnostics of several ViTs over a folder of images, as a CSV and a plot.

Every image is resized (shorter side to ``size``, bilinear with antialiasing) and center-cropped to
``size x size``, normalised with each model's own mean and std, and passed through every model. For each
block :func:`wsss.analysis.oversmoothing.layer_stats` gives the image's token cosine similarity, token
effective rank and attention numerical rank (mean over heads); the rows report their mean and standard
deviation (``ddof=0``) over the images. Token statistics use the patch tokens only; attention matrices
include the prefix (class) token.

Models come from a wsss checkpoint (:func:`model_from_checkpoint_file`), a wsss config
(:func:`model_from_config`) or a timm name (:func:`model_from_timm`); all three build the backbone through
:func:`wsss.models.build_backbone`, so every block runs a wsss attention variant (``vanilla`` for a timm
name) whose attention matrices can be recorded.

    models = {"vanilla": model_from_config("configs/voc_vanilla.py", pretrained=""),
              "centered": model_from_config("configs/voc_centered.py", pretrained="")}
    result = diagnose_folder(models, "data/toy_voc/JPEGImages", size=224, max_images=32)
    write_layers_csv(result.rows, "out/layers.csv")
    plot_layers(result.rows, "out/layers.png")
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from wsss.analysis.constants import FP32_PRECISION
from wsss.analysis.oversmoothing import RANK_THRESHOLD, layer_stats
from wsss.config import load_config
from wsss.data.folder import ImageFolderDataset, Skipped
from wsss.data.transforms import backbone_mean_std
from wsss.model_file import model_from_checkpoint
from wsss.models import build_backbone, build_model_backbone
from wsss.utils.fileio import atomic_write_bytes, atomic_write_text
from wsss.utils.tensors import fp32_precision

__all__ = [
    "COLUMNS",
    "FolderDiagnosis",
    "ModelEntry",
    "diagnose",
    "diagnose_folder",
    "find_vit",
    "model_from_checkpoint_file",
    "model_from_config",
    "model_from_timm",
    "plot_layers",
    "prepare_image",
    "write_layers_csv",
]

METRICS = ("cosine", "effective_rank", "attn_numerical_rank")
"""Per-block statistics of :func:`wsss.analysis.oversmoothing.layer_stats`, in column order."""

COLUMNS = (
    "model", "layer",
    *(name for metric in METRICS for name in (metric, f"{metric}_std")),
    "images", "tokens", "dim",
)  # fmt: skip
"""Columns of ``layers.csv``: ``tokens`` is the number of patch tokens per image, ``dim`` their width."""


@dataclass
class ModelEntry:
    """A model to diagnose with the preprocessing it expects.

    Attributes:
        model: A timm ``VisionTransformer``, a :class:`wsss.models.ViTBackbone`, or a module whose
            ``.backbone`` is either (e.g. :class:`wsss.models.WSSSModel`).
        mean: RGB normalisation mean (0-1 scale).
        std: RGB normalisation std.
    """

    model: nn.Module
    mean: tuple[float, ...]
    std: tuple[float, ...]


@dataclass
class FolderDiagnosis:
    """What :func:`diagnose_folder` measured.

    Attributes:
        rows: One dict per (model, block) with the keys of :data:`COLUMNS`.
        images: Relative paths of the images used.
        skipped: Files not used (unreadable images, non-image files), with the reason.
    """

    rows: list[dict[str, Any]]
    images: list[str] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)


def find_vit(model: nn.Module) -> VisionTransformer:
    """The timm VisionTransformer inside ``model`` (itself, its ``.vit``, or its ``.backbone``'s)."""
    for candidate in (model, getattr(model, "backbone", None)):
        if isinstance(candidate, VisionTransformer):
            return candidate
        if isinstance(getattr(candidate, "vit", None), VisionTransformer):
            return candidate.vit
    raise TypeError(
        f"{type(model).__name__} holds no timm VisionTransformer (as itself, .vit, .backbone or .backbone.vit)"
    )


def _seeded(seed: int, build: Callable[[], nn.Module]) -> nn.Module:
    """``build()`` under ``torch.manual_seed(seed)``, leaving the global RNG as it was, in eval mode.

    The same seed gives the same weights whatever the attention variant (the variant keeps timm's weights),
    so random-init variants differ only in their attention.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build().eval()


def model_from_timm(name: str, pretrained: str = "hub", seed: int = 0) -> ModelEntry:
    """timm's ``name`` with ``vanilla`` attention in every block (the same function as timm's attention).

    Args:
        name: A timm VisionTransformer name, optionally with a weight tag (``vit_small_patch16_224.augreg_in1k``).
        pretrained: ``"hub"`` (timm's weights), ``""`` (random init) or a timm state_dict file.
        seed: Seed of the random initialisation.
    """
    backbone = _seeded(seed, lambda: build_backbone(name, pretrained, attention="vanilla"))
    return ModelEntry(backbone, *backbone_mean_std(name))


def model_from_config(
    path: str | Path, pretrained: str | None = None, options: Mapping[str, Any] | None = None, seed: int = 0
) -> ModelEntry:
    """The backbone (with its attention variant) that a wsss config describes; heads are not built.

    Args:
        path: A wsss config file.
        pretrained: Overrides ``model.pretrained`` (``""`` random init, ``"hub"``, or a file) when not None.
        options: ``--cfg-options`` style overrides, ``{"model.attention.gamma": -0.5}``.
        seed: Seed of the random initialisation.
    """
    cfg = load_config(path, dict(options or {})).model
    if pretrained is not None:
        cfg = dataclasses.replace(cfg, pretrained=pretrained)
    return ModelEntry(_seeded(seed, lambda: build_model_backbone(cfg)), *backbone_mean_std(cfg.backbone))


def model_from_checkpoint_file(path: str | Path) -> ModelEntry:
    """The trained model of a wsss checkpoint, with the mean and std it was trained with."""
    model, ckpt = model_from_checkpoint(path)
    return ModelEntry(model, tuple(ckpt["mean"]), tuple(ckpt["std"]))


def prepare_image(image: np.ndarray, size: int) -> torch.Tensor:
    """Resize the shorter side to ``size`` (bilinear, antialiased) and center-crop to a square.

    Args:
        image: (H, W, 3) uint8 RGB.
        size: Output side.

    Returns:
        (3, size, size) float32 in [0, 1].
    """
    if image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"image must be (H, W, 3), got shape {image.shape}")
    x = torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1).float().div_(255.0)
    h, w = x.shape[-2:]
    scale = size / min(h, w)
    new_h, new_w = max(size, round(h * scale)), max(size, round(w * scale))
    if (new_h, new_w) != (h, w):
        x = F.interpolate(x[None], size=(new_h, new_w), mode="bilinear", antialias=True, align_corners=False)[0]
    top, left = (new_h - size) // 2, (new_w - size) // 2
    return x[:, top : top + size, left : left + size].clamp_(0.0, 1.0).contiguous()


def _normalize(x: torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
    m = torch.tensor(mean, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
    s = torch.tensor(std, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
    return (x - m) / s


class _Accumulator:
    """Per-image statistics of every (model, block), reduced to mean and std at the end."""

    def __init__(self, models: Mapping[str, ModelEntry], device: torch.device, threshold: float) -> None:
        self.models = models
        self.device = device
        self.threshold = threshold
        self.values: dict[str, list[list[dict[str, Any]]]] = {label: [] for label in models}
        self.shapes: dict[str, tuple[int, int]] = {}
        self.image_size: tuple[int, int] | None = None

    @torch.no_grad()
    def add(self, image: torch.Tensor) -> None:
        """Measure every model on ``image`` (3, H, W) in [0, 1], a GPU's float32 products as :data:`FP32_PRECISION`
        says."""
        if image.ndim != 3 or image.shape[0] != 3:
            raise ValueError(f"images must be (3, H, W), got shape {tuple(image.shape)}")
        if self.image_size is None:
            self.image_size = tuple(image.shape[-2:])
        elif tuple(image.shape[-2:]) != self.image_size:
            raise ValueError(
                f"images must share one size (statistics over different token counts do not compare): got "
                f"{tuple(image.shape[-2:])} after {self.image_size}; see prepare_image"
            )
        x = image[None].to(self.device)
        for label, entry in self.models.items():
            vit = find_vit(entry.model)
            with fp32_precision(FP32_PRECISION):
                self.values[label].append(layer_stats(vit, _normalize(x, entry.mean, entry.std), self.threshold))
            grid = vit.patch_embed.dynamic_feat_size(tuple(x.shape[-2:]))
            self.shapes[label] = (math.prod(grid), vit.embed_dim)

    def rows(self) -> list[dict[str, Any]]:
        out = []
        for label, per_image in self.values.items():
            if not per_image:
                continue
            tokens, dim = self.shapes[label]
            for layer in range(len(per_image[0])):
                row: dict[str, Any] = {"model": label, "layer": layer}
                for metric in METRICS:
                    vals = [rows[layer][metric] for rows in per_image]
                    if any(v is None for v in vals):
                        row[metric] = row[f"{metric}_std"] = None
                    else:
                        row[metric], row[f"{metric}_std"] = float(np.mean(vals)), float(np.std(vals))
                row.update(images=len(per_image), tokens=tokens, dim=dim)
                out.append(row)
        return out


def _prepare_models(models: Mapping[str, ModelEntry], device: str | torch.device) -> torch.device:
    device = torch.device(device)
    for label, entry in models.items():
        find_vit(entry.model)  # fail before any image is read
        if len(entry.mean) != 3 or len(entry.std) != 3:
            raise ValueError(f"model '{label}': mean and std need 3 values, got {entry.mean}, {entry.std}")
        entry.model.to(device).eval()
    return device


def diagnose(
    models: Mapping[str, ModelEntry],
    images: Iterable[torch.Tensor],
    threshold: float = RANK_THRESHOLD,
    device: str | torch.device = "cpu",
) -> list[dict[str, Any]]:
    """Per-block statistics of every model, mean and std over ``images``.

    Args:
        models: Label -> model; the models are moved to ``device`` and put in eval mode.
        images: (3, H, W) images in [0, 1], all of one size, not normalised (each model normalises with
            its own mean/std).
        threshold: Relative singular-value threshold of the attention numerical rank.
        device: Where the models run.

    Returns:
        One dict per (model, block), models in the order given, with the keys of :data:`COLUMNS`; the
        ``attn_numerical_rank`` columns are None for a block whose attention is not a wsss variant.

    Raises:
        ValueError: The images differ in size, or a model's mean/std do not have 3 values.
        TypeError: A model holds no timm VisionTransformer.
    """
    acc = _Accumulator(models, _prepare_models(models, device), threshold)
    for image in images:
        acc.add(image)
    return acc.rows()


def diagnose_folder(
    models: Mapping[str, ModelEntry],
    root: str | Path,
    size: int = 224,
    max_images: int | None = None,
    threshold: float = RANK_THRESHOLD,
    device: str | torch.device = "cpu",
    progress: bool = True,
) -> FolderDiagnosis:
    """:func:`diagnose` over the images under ``root`` (recursive, sorted), each made ``size x size``.

    Unreadable images are skipped and reported; they do not count towards ``max_images``.

    Args:
        models: Label -> model.
        root: Image folder.
        size: Side of the square crop (see :func:`prepare_image`).
        max_images: Use the first this many readable images (None: all).
        threshold: Relative singular-value threshold of the attention numerical rank.
        device: Where the models run.
        progress: Show a progress bar over the images.

    Raises:
        FileNotFoundError: ``root`` is not a folder.
        ValueError: No readable image.
    """
    from tqdm import tqdm

    dataset = ImageFolderDataset(root)
    acc = _Accumulator(models, _prepare_models(models, device), threshold)
    result = FolderDiagnosis(rows=[], skipped=list(dataset.skipped))
    total = len(dataset) if max_images is None else min(max_images, len(dataset))
    with tqdm(total=total, desc="diagnose", unit="img", disable=not progress, dynamic_ncols=True) as bar:
        for index in range(len(dataset)):
            if max_images is not None and len(result.images) >= max_images:
                break
            item = dataset[index]
            if item["error"] is not None:
                result.skipped.append(Skipped(item["path"], item["error"]))
                continue
            acc.add(prepare_image(item["image"], size))
            result.images.append(item["path"])
            bar.update()
    if not result.images:
        raise ValueError(f"no readable image under {root}")
    result.rows = acc.rows()
    return result


def write_layers_csv(rows: Iterable[Mapping[str, Any]], path: str | Path) -> None:
    """Write the rows of :func:`diagnose` as CSV with the header :data:`COLUMNS`, atomically.

    None becomes an empty cell; floats keep 6 significant digits.
    """
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(COLUMNS)
    for row in rows:
        writer.writerow(["" if row[c] is None else f"{row[c]:.6g}" if isinstance(row[c], float) else row[c]
                         for c in COLUMNS])  # fmt: skip
    atomic_write_text(path, buf.getvalue())


def plot_layers(rows: Iterable[Mapping[str, Any]], path: str | Path, title: str | None = None, dpi: int = 100) -> None:
    """Three panels against the block index, one line per model with a +-1 std band; PNG, written atomically.

    Panels: token cosine similarity, token effective rank, attention numerical rank (mean over heads).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_model: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        by_model.setdefault(row["model"], []).append(row)
    panels = [
        ("cosine", "token cosine similarity"),
        ("effective_rank", "effective rank of the patch tokens"),
        ("attn_numerical_rank", "numerical rank of the attention"),
    ]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for label, model_rows in by_model.items():
        model_rows = sorted(model_rows, key=lambda r: r["layer"])
        layers = np.array([r["layer"] for r in model_rows])
        for ax, (metric, _) in zip(axes, panels, strict=True):
            mean = np.array([np.nan if r[metric] is None else r[metric] for r in model_rows], dtype=float)
            std = np.array([np.nan if r[metric] is None else r[f"{metric}_std"] for r in model_rows], dtype=float)
            (line,) = ax.plot(layers, mean, marker="o", markersize=3, label=label)
            ax.fill_between(layers, mean - std, mean + std, color=line.get_color(), alpha=0.2, linewidth=0)
    first = next(iter(by_model.values()), [{}])[0]
    limits = {"effective_rank": "min(N, D)", "attn_numerical_rank": "N + prefix tokens"}
    for ax, (metric, name) in zip(axes, panels, strict=True):
        ax.set_title(name + (f" (max {limits[metric]})" if metric in limits else ""), fontsize=10)
        ax.set_xlabel("block")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    if title is None and first:
        title = f"mean +- std over {first['images']} images; N = {first['tokens']} patch tokens"
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
