"""Ablation grids: the paper's Table 4 (losses x centering) and the attention variants, run on any config.

Each grid row is a set of config overrides applied to one base config; every row is trained with
:func:`wsss.engine.train.train` in its own work dir and scored on the validation split: CAM mIoU of the last
layer and of the aux layer, segmentation mIoU, and the mean token cosine similarity of the last block on
validation images. Rows already trained (a final checkpoint in their work dir) are not trained again, so
an interrupted grid resumes where it stopped. The folder's ``results.json`` and ``results.md`` hold every row
scored into it, by any process: several runs may fill one grid folder with different rows at once
(:func:`record_results` merges under a file lock).
"""

from __future__ import annotations

import fcntl
import json
from pathlib import Path
from typing import Any

from wsss.analysis.diagnose import diagnose_folder, model_from_checkpoint_file
from wsss.config import Config, from_dict, to_dict
from wsss.engine.train import train
from wsss.utils.fileio import atomic_write_text

VARIANTS = ("vanilla", "centered", "neutreno", "gfsa", "contranorm")

LOSSES = {
    "L_cls": {"loss.aux_weight": 0.0, "loss.seg_weight": 0.0, "loss.reg_weight": 0.0},
    "+ L_cls_aux": {"loss.aux_weight": 1.0, "loss.seg_weight": 0.0, "loss.reg_weight": 0.0},
    "+ L_seg": {"loss.aux_weight": 1.0, "loss.reg_weight": 0.0},
    "+ L_reg": {"loss.aux_weight": 1.0},
}
"""Table 4's loss rows as overrides; unnamed weights keep the base config's values."""


def grid(name: str) -> dict[str, dict[str, Any]]:
    """Row name -> overrides of the named grid: ``table4`` (8 rows), ``variants`` (5) or ``all`` (both).

    Raises:
        ValueError: Unknown grid name.
    """
    table4 = {
        f"{loss} | {variant}": {**over, "model.attention.name": variant}
        for loss, over in LOSSES.items()
        for variant in ("vanilla", "centered")
    }
    variants = {f"+ L_reg | {v}": {"model.attention.name": v} for v in VARIANTS}
    grids = {"table4": table4, "variants": variants, "all": {**table4, **variants}}
    if name not in grids:
        raise ValueError(f"unknown ablation grid '{name}'; choose one of {sorted(grids)}")
    return grids[name]


def apply_overrides(cfg: Config, overrides: dict[str, Any]) -> Config:
    """A copy of ``cfg`` with dotted-key ``overrides`` applied and validated."""
    data = to_dict(cfg)
    for key, value in overrides.items():
        node = data
        *parents, leaf = key.split(".")
        for part in parents:
            node = node[part]
        if leaf not in node:
            raise KeyError(f"ablation override '{key}' names no config key")
        node[leaf] = value
    return from_dict(Config, data)


def slug(name: str) -> str:
    """A folder name for a row: ``+ L_seg | centered`` -> ``L_seg-centered``."""
    keep = "".join(c if c.isalnum() or c == "_" else "-" for c in name.replace("+", "").replace(" ", ""))
    return "-".join(p for p in keep.split("-") if p)


def last_layer_cosine(checkpoint: Path, image_dir: Path, max_images: int, size: int) -> float:
    """Mean token cosine similarity of the last block over ``max_images`` images of ``image_dir``."""
    models = {"m": model_from_checkpoint_file(checkpoint)}
    rows = diagnose_folder(models, image_dir, size=size, max_images=max_images, progress=False).rows
    return float(rows[-1]["cosine"])


def run_grid(
    cfg: Config,
    rows: dict[str, dict[str, Any]],
    out_dir: str | Path,
    device: str | None = None,
    cosine_images: int = 32,
) -> list[dict[str, Any]]:
    """Train and score every row; after each, merge it into ``results.json`` and ``results.md`` in ``out_dir``
    (:func:`record_results`).

    Returns:
        One dict per row: ``name``, ``overrides``, ``cam_mIoU``, ``aux_cam_mIoU``, ``seg_mIoU`` (None when
        the row has no segmentation loss, as in the paper), ``last_cosine``, ``checkpoint``.
    """
    out = Path(out_dir)
    results = []
    for name, overrides in rows.items():
        row_cfg = apply_overrides(cfg, overrides)
        work = out / slug(name)
        final = work / f"iter_{row_cfg.train.max_iters}.pth"
        metrics_file = work / "val_metrics.json"
        if final.is_file() and metrics_file.is_file():
            metrics = json.loads(metrics_file.read_text())
        else:
            res = train(row_cfg, work_dir=work, resume=True, device=device)
            metrics = dict(res.val.metrics) if res.val is not None else {}
            atomic_write_text(metrics_file, json.dumps(metrics, indent=1) + "\n")
        image_dir = Path(row_cfg.data.root) / "JPEGImages"
        results.append(
            {
                "name": name,
                "overrides": overrides,
                "cam_mIoU": metrics.get("cam_mIoU"),
                "aux_cam_mIoU": metrics.get("aux_cam_mIoU") if row_cfg.loss.aux_weight > 0 else None,
                "seg_mIoU": metrics.get("seg_mIoU") if row_cfg.loss.seg_weight > 0 else None,
                "last_cosine": last_layer_cosine(final, image_dir, cosine_images, row_cfg.data.crop_size),
                "checkpoint": str(final),
            }
        )
        record_results(out, results[-1:])
    return results


def record_results(out_dir: str | Path, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Merge ``rows`` into ``out_dir/results.json`` (a row of the same name is replaced) and rewrite
    ``results.md``, both atomically and under an exclusive lock on ``out_dir/results.lock``, so that processes
    filling one grid folder keep each other's rows. Rows are kept in the order of the ``all`` grid.

    Returns:
        Every row now recorded.

    Raises:
        ValueError: ``results.json`` exists but is not a list of rows; the message names the file and the fix.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.json"
    with open(out / "results.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        try:
            old = json.loads(path.read_text()) if path.is_file() else []
            if not isinstance(old, list) or not all(isinstance(r, dict) and "name" in r for r in old):
                raise ValueError("not a list of rows")
        except ValueError as err:
            raise ValueError(f"{path}: not an ablation results file ({err}); move it away and run again") from None
        names = {r["name"] for r in rows}
        order = list(grid("all"))
        merged = [r for r in old if r["name"] not in names] + rows
        merged.sort(key=lambda r: order.index(r["name"]) if r["name"] in order else len(order))
        atomic_write_text(path, json.dumps(merged, indent=1) + "\n")
        atomic_write_text(out / "results.md", format_results(merged))
    return merged


def format_results(results: list[dict[str, Any]]) -> str:
    """Markdown table of :func:`run_grid` results (mIoU in percent; '-' where a head was not trained)."""

    def cell(v: Any, digits: int) -> str:
        return "-" if v is None else f"{v:.{digits}f}"

    lines = [
        "| losses | attention | CAM mIoU (last) | CAM mIoU (aux) | seg mIoU | last-layer cosine |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in results:
        losses, _, variant = r["name"].partition(" | ")
        lines.append(
            f"| {losses} | {variant} | {cell(r['cam_mIoU'], 1)} | {cell(r['aux_cam_mIoU'], 1)} | "
            f"{cell(r['seg_mIoU'], 1)} | {cell(r['last_cosine'], 3)} |"
        )
    return "\n".join(lines) + "\n"

