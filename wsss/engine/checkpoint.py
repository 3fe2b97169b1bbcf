"""Self-describing checkpoints: weights, training state, resolved config, classes, preprocessing, commit.

Checkpoints are written atomically and read with ``torch.load(weights_only=True)``: they hold only
tensors and plain Python containers, never pickled code. A model is rebuilt from a checkpoint alone.
"""

from __future__ import annotations

import random
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import torch

from wsss.config import Config, from_dict, to_dict
from wsss.models import build_model
from wsss.utils.fileio import atomic_torch_save, atomic_write_text

LAST_CHECKPOINT = "last_checkpoint"
"""File in the work dir naming the newest checkpoint (as mmengine does)."""


def git_commit() -> str:
    """The source tree's git commit (with ``-dirty`` if modified), or ``unknown`` outside a checkout."""
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=here, capture_output=True, text=True, check=True, timeout=10,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{sha}-dirty" if dirty else sha


def rng_state() -> dict[str, Any]:
    """Every random number generator the training loop touches, as tensors and plain containers."""
    np_state = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "rest": list(np_state[2:])},
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned (one rank's entry of a checkpoint's ``rng`` list)."""
    torch.set_rng_state(state["torch"])
    keys = state["numpy"]["keys"].numpy().astype(np.uint32)
    np.random.set_state(("MT19937", keys, *state["numpy"]["rest"]))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    path: str | Path,
    model: torch.nn.Module,
    cfg: Config,
    classes: list[str],
    mean: tuple[float, ...],
    std: tuple[float, ...],
    step: int,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    rng: list[dict[str, Any]] | None = None,
) -> None:
    """Write a checkpoint atomically and point the work dir's ``last_checkpoint`` at it.

    Args:
        path: Output file.
        model: The bare model (never the DDP or compile wrapper).
        cfg: The resolved config.
        classes: Class names, background first.
        mean: Normalisation mean the model was trained with.
        std: Normalisation std.
        step: Number of iterations completed.
        optimizer: Saved with its state when given (for resuming).
        scheduler: Saved via its ``state_dict()`` when given.
        rng: Every rank's :func:`rng_state`, rank order (default: this process's alone).
    """
    path = Path(path)
    payload = {
        "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "config": to_dict(cfg),
        "classes": list(classes),
        "mean": list(mean),
        "std": list(std),
        "step": step,
        "git_commit": git_commit(),
        "rng": rng if rng is not None else [rng_state()],
    }
    if optimizer is not None:
        payload["optimizer"] = optimizer.state_dict()
    if scheduler is not None:
        payload["scheduler"] = scheduler.state_dict()
    atomic_torch_save(payload, path)
    atomic_write_text(path.parent / LAST_CHECKPOINT, path.name + "\n")


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a checkpoint safely (``weights_only=True``).

    Raises:
        FileNotFoundError: The file is missing.
        ValueError: The file is not a wsss checkpoint (e.g. a bare timm state_dict).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # torch raises several types for corrupt or unsafe files
        raise ValueError(f"{path}: cannot be read as a checkpoint ({err})") from None
    if not isinstance(ckpt, dict) or "model" not in ckpt or "config" not in ckpt:
        raise ValueError(
            f"{path}: not a wsss checkpoint (no model/config). Backbone weights (timm state_dicts) go in "
            "model.pretrained instead."
        )
    return ckpt


def find_resume_checkpoint(work_dir: str | Path) -> Path | None:
    """The checkpoint named by ``work_dir/last_checkpoint``, or None if there is none yet."""
    marker = Path(work_dir) / LAST_CHECKPOINT
    if not marker.is_file():
        return None
    path = Path(work_dir) / marker.read_text().strip()
    if not path.is_file():
        raise FileNotFoundError(f"{marker} names {path}, which does not exist; pass --resume PATH explicitly")
    return path


def config_from_checkpoint(ckpt: dict[str, Any]) -> Config:
    """The validated config stored in a checkpoint."""
    return from_dict(Config, ckpt["config"])


def model_from_checkpoint(checkpoint: str | Path | dict[str, Any], device: str | torch.device = "cpu"):
    """Rebuild the model from a checkpoint alone (a path, or what :func:`load_checkpoint` returned), in eval mode.

    Returns:
        ``(model, ckpt)``: ckpt holds ``config``, ``classes``, ``mean``, ``std``, ``step``.
    """
    ckpt = checkpoint if isinstance(checkpoint, dict) else load_checkpoint(checkpoint)
    cfg = config_from_checkpoint(ckpt)
    cfg.model.pretrained = ""  # the checkpoint holds every weight
    model = build_model(cfg.model, num_classes=len(ckpt["classes"]))
    model.load_state_dict(ckpt["model"], strict=True)
    return model.to(device).eval(), ckpt
