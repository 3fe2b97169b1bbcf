"""Self-describing checkpoints: weights, training state, resolved config, classes, preprocessing, commit.

Checkpoints are written atomically and read with ``torch.load(weights_only=True)``: they hold only
tensors and plain Python containers, never pickled code. A model is rebuilt from a checkpoint alone.

Integrity: weights with a NaN or infinite value are never saved (:class:`NonFiniteWeightsError`). Beside
each checkpoint ``<name>.sha256`` holds the SHA-256 of its bytes, written before the checkpoint itself;
:func:`load_checkpoint` refuses a file that does not match it (a bit flip, a truncated copy), and
:func:`load_resume_checkpoint` then falls back to the next newest valid checkpoint of the work dir.
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

from wsss.config import Config, ConfigError, from_dict, to_dict
from wsss.models import build_model
from wsss.utils.fileio import atomic_write_bytes, atomic_write_text

LAST_CHECKPOINT = "last_checkpoint"
"""File in the work dir naming the newest checkpoint (as mmengine does)."""

CHECKSUM_SUFFIX = ".sha256"
"""``<checkpoint><CHECKSUM_SUFFIX>`` holds the checkpoint's SHA-256 (hex)."""

_STEP_NAME = re.compile(r"iter_(\d+)\.pth")


class NonFiniteWeightsError(FloatingPointError):
    """A model about to be saved holds NaN or infinite values; nothing was written."""


def checksum_path(path: str | Path) -> Path:
    """The checksum file beside checkpoint ``path``."""
    path = Path(path)
    return path.with_name(path.name + CHECKSUM_SUFFIX)


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
        NonFiniteWeightsError: A weight is NaN or infinite; no file is written or changed.
    """
    path = Path(path)
    weights = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    bad = [k for k, v in weights.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if bad:
        raise NonFiniteWeightsError(
            f"not saving {path}: {len(bad)} weight tensor(s) hold NaN or inf (first: {bad[0]}); the previous "
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
    if optimizer is not None:
        payload["optimizer"] = to_host(optimizer.state_dict())
    if scheduler is not None:
        payload["scheduler"] = scheduler.state_dict()
    buf = io.BytesIO()
    torch.save(payload, buf)
    data = buf.getvalue()
    atomic_write_text(checksum_path(path), hashlib.sha256(data).hexdigest() + "\n")
    atomic_write_bytes(path, data)
    atomic_write_text(path.parent / LAST_CHECKPOINT, path.name + "\n")


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a checkpoint safely (``weights_only=True``), checking it against its ``.sha256`` file if present.

    Raises:
        FileNotFoundError: The file is missing.
        ValueError: The file does not match its checksum, is not a wsss checkpoint (e.g. a bare timm
            state_dict), or holds a config this version cannot read.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    data = path.read_bytes()
    expected = checksum_path(path).read_text().strip() if checksum_path(path).is_file() else None
    if expected is not None and hashlib.sha256(data).hexdigest() != expected:
        raise ValueError(
            f"{path}: corrupt (its SHA-256 differs from {checksum_path(path).name}; truncated or damaged copy)"
        )
    try:
        ckpt = torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
    except Exception as err:  # torch raises several types for corrupt or unsafe files
        raise ValueError(f"{path}: cannot be read as a checkpoint ({err})") from None
    if not isinstance(ckpt, dict) or "model" not in ckpt or "config" not in ckpt:
        raise ValueError(
            f"{path}: not a wsss checkpoint (no model/config). Backbone weights (timm state_dicts) go in "
            "model.pretrained instead."
        )
    try:
        config_from_checkpoint(ckpt)
    except ConfigError as err:
        raise ValueError(f"{path}: its config does not fit this version of wsss ({err})") from None
    return ckpt


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

    A missing, truncated or corrupt newest checkpoint is skipped with a warning on stderr naming it, and the
    next newest is tried (:func:`checkpoints_newest_first`).

    Raises:
        ValueError: The work dir holds checkpoints but none of them is valid.
    """
    candidates = checkpoints_newest_first(work_dir)
    for path in candidates:
        try:
            return path, load_checkpoint(path, map_location)
        except (FileNotFoundError, ValueError) as err:
            print(f"warning: not resuming from {path}: {err}; trying the previous checkpoint", file=sys.stderr)
    if candidates:
        raise ValueError(
            f"{work_dir}: none of its checkpoints is valid ({', '.join(p.name for p in candidates)}); pass "
            "--resume PATH to a good one, or --overwrite to start from scratch"
        )
    return None


def config_from_checkpoint(ckpt: dict[str, Any]) -> Config:
    """The validated config stored in a checkpoint."""
    return from_dict(Config, ckpt["config"])


def load_weights(model: torch.nn.Module, weights: dict[str, torch.Tensor], source: str | Path) -> None:
    """``model.load_state_dict(weights, strict=True)``, with an error naming ``source`` when they do not fit.

    Raises:
        ValueError: Missing, unexpected or differently shaped weights.
    """
    try:
        model.load_state_dict(weights, strict=True)
    except (RuntimeError, KeyError) as err:
        first = str(err).strip().splitlines()
        raise ValueError(
            f"{source}: its weights do not fit the model its config builds ({first[0] if first else err}"
            f"{' ...' if len(first) > 1 else ''}); was the file edited or made by another wsss version?"
        ) from None


def model_from_checkpoint(
    checkpoint: str | Path | dict[str, Any], device: str | torch.device = "cpu", source: str | Path | None = None
):
    """Rebuild the model from a checkpoint alone (a path, or what :func:`load_checkpoint` returned), in eval mode.

    Args:
        checkpoint: A path, or a loaded checkpoint.
        device: Where the model goes.
        source: Name used in errors (default: the path, or ``checkpoint``).

    Returns:
        ``(model, ckpt)``: ckpt holds ``config``, ``classes``, ``mean``, ``std``, ``step``.

    Raises:
        ValueError: The checkpoint's config does not build a model its weights fit (the message names it).
    """
    source = source or (checkpoint if not isinstance(checkpoint, dict) else "checkpoint")
    ckpt = checkpoint if isinstance(checkpoint, dict) else load_checkpoint(checkpoint)
    cfg = config_from_checkpoint(ckpt)
    cfg.model.pretrained = ""  # the checkpoint holds every weight
    try:
        model = build_model(cfg.model, num_classes=len(ckpt["classes"]))
    except (KeyError, TypeError, RuntimeError) as err:
        raise ValueError(f"{source}: its config does not build a model ({type(err).__name__}: {err})") from None
    load_weights(model, ckpt["model"], source)
    return model.to(device).eval(), ckpt
