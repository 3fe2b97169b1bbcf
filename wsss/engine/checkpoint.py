"""Self-describing checkpoints: weights, training state, resolved config, classes, preprocessing, commit.

Checkpoints are written atomically and hold only tensors and plain Python containers, never pickled code; they are
read (with ``torch.load(weights_only=True)``) and a model is rebuilt from one alone by :mod:`wsss.model_file`,
which every tool shares. This module keeps what training needs: writing, the random state, resuming.

Integrity: weights or optimiser state with a NaN or infinite value are never saved (:class:`NonFiniteWeightsError`)
nor resumed from (:func:`check_resumable`). Beside each checkpoint ``<name>.sha256`` holds the SHA-256 of its
bytes, written before the checkpoint itself; :func:`wsss.model_file.load_checkpoint` refuses a file that does not
match it (a bit flip, a truncated copy), and :func:`load_resume_checkpoint` then falls back to the next newest valid
checkpoint of the work dir.
"""

from __future__ import annotations

import hashlib
import io
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from wsss.config import Config, to_dict
from wsss.model_file import checksum_path, load_checkpoint
from wsss.utils.fileio import atomic_write_bytes, atomic_write_text

LAST_CHECKPOINT = "last_checkpoint"
"""File in the work dir naming the newest checkpoint (as mmengine does)."""

_STEP_NAME = re.compile(r"iter_(\d+)\.pth")


class NonFiniteWeightsError(FloatingPointError):
    """A model about to be saved holds NaN or infinite values; nothing was written."""


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


def to_host(obj: Any) -> Any:
    """``obj`` (nested dicts, lists and tuples) with every tensor copied to the CPU: a checkpoint of a GPU run then
    loads anywhere with a plain ``torch.load(path, weights_only=True)``, without a device or ``map_location``."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: to_host(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_host(v) for v in obj)
    return obj


def non_finite_tensors(obj: Any, prefix: str = "") -> list[str]:
    """The dotted names of the floating-point tensors in ``obj`` (nested dicts, lists, tuples) holding a NaN or inf."""
    if isinstance(obj, torch.Tensor):
        return [prefix] if obj.is_floating_point() and not bool(torch.isfinite(obj).all()) else []
    if isinstance(obj, dict):
        items = obj.items()
    elif isinstance(obj, (list, tuple)):
        items = enumerate(obj)
    else:
        return []
    return [
        name for key, value in items for name in non_finite_tensors(value, f"{prefix}.{key}" if prefix else str(key))
    ]


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
        optimizer: Saved with its state when given (for resuming). Every tensor is saved from the CPU.
        scheduler: Saved via its ``state_dict()`` when given.
        rng: Every rank's :func:`rng_state`, rank order (default: this process's alone).

    Raises:
        NonFiniteWeightsError: A weight or an optimiser state tensor is NaN or infinite; no file is written or
            changed.
    """
    path = Path(path)
    weights = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    optimizer_state = to_host(optimizer.state_dict()) if optimizer is not None else None
    for what, bad in (
        ("weight tensor(s)", non_finite_tensors(weights)),
        ("optimiser state tensor(s) (AdamW moments)", non_finite_tensors(optimizer_state, "optimizer")),
    ):
        if bad:
            raise NonFiniteWeightsError(
                f"not saving {path}: {len(bad)} {what} hold NaN or inf (first: {bad[0]}); the previous "
                "checkpoint is kept. Lower optim.lr or check the data."
            )
    payload = {
        "model": weights,
        "config": to_dict(cfg),
        "classes": list(classes),
        "mean": list(mean),
        "std": list(std),
        "step": step,
        "git_commit": git_commit(),
        "rng": rng if rng is not None else [rng_state()],
    }
    if optimizer_state is not None:
        payload["optimizer"] = optimizer_state
    if scheduler is not None:
        payload["scheduler"] = scheduler.state_dict()
    buf = io.BytesIO()
    torch.save(payload, buf)
    data = buf.getvalue()
    atomic_write_text(checksum_path(path), hashlib.sha256(data).hexdigest() + "\n")
    atomic_write_bytes(path, data)
    atomic_write_text(path.parent / LAST_CHECKPOINT, path.name + "\n")


def checkpoints_newest_first(work_dir: str | Path) -> list[Path]:
    """The work dir's checkpoints to resume from, newest first: the one ``last_checkpoint`` names, then every
    ``iter_<N>.pth`` by decreasing N."""
    work_dir = Path(work_dir)
    found = sorted(
        (p for p in work_dir.glob("iter_*.pth") if _STEP_NAME.fullmatch(p.name)),
        key=lambda p: int(_STEP_NAME.fullmatch(p.name).group(1)),
        reverse=True,
    )
    marker = work_dir / LAST_CHECKPOINT
    named = work_dir / marker.read_text().strip() if marker.is_file() else None
    return [named, *[p for p in found if p != named]] if named is not None else found


def load_resume_checkpoint(
    work_dir: str | Path, map_location: str | torch.device = "cpu"
) -> tuple[Path, dict[str, Any]] | None:
    """The newest valid checkpoint of a work dir and its contents, or None if it has none.

    A missing, truncated or corrupt newest checkpoint, or one that cannot train on (:func:`check_resumable`), is
    skipped with a warning on stderr naming it, and the next newest is tried (:func:`checkpoints_newest_first`).

    Raises:
        ValueError: The work dir holds checkpoints but none of them is valid.
    """
    candidates = checkpoints_newest_first(work_dir)
    for path in candidates:
        try:
            return path, check_resumable(load_checkpoint(path, map_location), path)
        except (FileNotFoundError, ValueError) as err:
            print(f"warning: not resuming from {path}: {err}; trying the previous checkpoint", file=sys.stderr)
    if candidates:
        raise ValueError(
            f"{work_dir}: none of its checkpoints is valid ({', '.join(p.name for p in candidates)}); pass "
            "--resume PATH to a good one, or --overwrite to start from scratch"
        )
    return None


def check_resumable(ckpt: dict[str, Any], path: str | Path) -> dict[str, Any]:
    """``ckpt`` itself, once every tensor of its weights and optimiser state is finite (a run resumed from a NaN or
    inf AdamW moment cannot train; such files were written before :func:`save_checkpoint` refused them).

    Raises:
        ValueError: A non-finite tensor; the message names ``path`` and the first such tensor.
    """
    bad = non_finite_tensors(ckpt["model"], "model") + non_finite_tensors(ckpt.get("optimizer"), "optimizer")
    if bad:
        part = "optimiser state" if bad[0].startswith("optimizer") else "weights"
        raise ValueError(
            f"{path}: its {part} hold NaN or inf ({len(bad)} tensor(s), first: {bad[0]}); a run cannot resume "
            "from it: resume from an earlier checkpoint (--resume PATH) or lower optim.lr and start again"
        )
    return ckpt
