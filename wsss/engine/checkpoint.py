"""Self-describing checkpoints: weights, training state, resolved config, classes, preprocessing, commit.

Checkpoints are written atomically and read with ``torch.load(weights_only=True)``: they hold only
tensors and plain Python containers, never pickled code. A model is rebuilt from a checkpoint alone.

Integrity: weights or optimiser state with a NaN or infinite value are never saved (:class:`NonFiniteWeightsError`)
nor resumed from (:func:`check_resumable`). Beside each checkpoint ``<name>.sha256`` holds the SHA-256 of its
bytes, written before the checkpoint itself; :func:`load_checkpoint` refuses a file that does not match it (a bit
flip, a truncated copy), and :func:`load_resume_checkpoint` then falls back to the next newest valid checkpoint of
the work dir.

A checkpoint is data: before a model is rebuilt from one (:func:`model_from_checkpoint`), its config is read with
the project's own key and type checks (no path reaches timm) and the sizes it states are compared with the stored
weights (:func:`checked_model_config`), so a crafted file opens nothing and allocates no larger model.
"""

from __future__ import annotations

import hashlib
import io
import pickle
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


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a checkpoint safely (``weights_only=True``), checking it against its ``.sha256`` file if present.

    A ``tools/export.py --safetensors`` export is refused here (it holds no training state); the tools that need
    only the model read it with :func:`wsss.inference.predictor.read_model_file`.

    Raises:
        FileNotFoundError: The file is missing.
        ValueError: The file does not match its checksum, is not a wsss checkpoint (e.g. a bare timm
            state_dict, a pickled module, a safetensors export), or holds a config this version cannot read.
            One line naming the file; torch's own message (which suggests loading the file unsafely) is never
            passed on.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    if path.suffix == ".safetensors":
        raise ValueError(
            f"{path}: a .safetensors export (weights, config and classes, no training state), not a wsss "
            "checkpoint (.pth written by tools/train.py); tools/infer.py, tools/test.py and tools/export.py read "
            "exports, training and the other tools need the .pth"
        )
    data = path.read_bytes()
    expected = checksum_path(path).read_text().strip() if checksum_path(path).is_file() else None
    if expected is not None and hashlib.sha256(data).hexdigest() != expected:
        raise ValueError(
            f"{path}: corrupt (its SHA-256 differs from {checksum_path(path).name}; truncated or damaged copy)"
        )
    try:
        ckpt = torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
    except pickle.UnpicklingError:  # its message advises weights_only=False: never shown
        raise ValueError(
            f"{path}: cannot be read as a checkpoint: not a wsss checkpoint (.pth written by tools/train.py); it "
            "holds more than tensors and plain containers, or is no torch file, and wsss loads nothing else (it "
            "could run code)"
        ) from None
    except Exception as err:  # torch raises several types for empty, truncated or foreign files
        raise ValueError(
            f"{path}: cannot be read as a checkpoint: not a wsss checkpoint (.pth written by tools/train.py); "
            f"empty, truncated or another format ({type(err).__name__})"
        ) from None
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
        lines = [line.strip().rstrip(". ") for line in str(err).strip().splitlines()]  # torch: a heading, one per kind
        problems = lines[1:] or lines
        raise ValueError(
            f"{source}: its weights do not fit the model its config builds ({'; '.join(problems[:3])}"
            f"{' ...' if len(problems) > 3 else ''}); was the file edited or made by another wsss version?"
        ) from None


def model_from_checkpoint(
    checkpoint: str | Path | dict[str, Any], device: str | torch.device = "cpu", source: str | Path | None = None
):
    """Rebuild the model from a checkpoint alone (a path, or what :func:`load_checkpoint` returned), in eval mode.

    A checkpoint is data: its config is checked before anything is built (:func:`checked_model_config`), so a
    crafted one opens no file and allocates no model other than the one its stored weights describe.

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
    cfg = checked_model_config(ckpt, source)
    model = build_model(cfg.model, num_classes=len(ckpt["classes"]))
    load_weights(model, ckpt["model"], source)
    return model.to(device).eval(), ckpt


def checked_model_config(ckpt: dict[str, Any], source: str | Path) -> Config:
    """The config of a loaded checkpoint, once it is known to build exactly the model its weights describe, with
    ``model.pretrained`` cleared (the checkpoint holds every weight). Nothing is built for real: the stated sizes
    are compared with the stored ones first (:func:`check_weights_fit_config`), then every key and shape with a
    model built on the meta device (no memory).

    Raises:
        ValueError: The config does not fit this version, or does not build a model its weights fit; one line
            naming ``source``.
    """
    try:
        cfg = config_from_checkpoint(ckpt)
    except ConfigError as err:
        raise ValueError(f"{source}: its config does not fit this version of wsss ({err})") from None
    cfg.model.pretrained = ""
    check_weights_fit_config(ckpt, cfg, source)
    try:
        with torch.device("meta"):
            skeleton = build_model(cfg.model, num_classes=len(ckpt["classes"]))
    except (KeyError, TypeError, ValueError, RuntimeError, IndexError, AssertionError) as err:  # timm asserts too
        raise ValueError(f"{source}: its config does not build a model ({type(err).__name__}: {err})") from None
    _compare_shapes(skeleton, ckpt["model"], source)
    return cfg


_BLOCK = re.compile(r"backbone\.vit\.blocks\.(\d+)\.")
_PATCH_EMBED = "backbone.vit.patch_embed.proj.weight"
_CLASSIFIER = "decoder.cls.weight"


def check_weights_fit_config(ckpt: dict[str, Any], cfg: Config, source: str | Path) -> None:
    """Compare the sizes a checkpoint's config states with its stored weights, before any model is built.

    The backbone's ``embed_dim``, ``depth`` and ``patch_size`` (where ``model.backbone_kwargs`` gives them) and the
    number of classes must be those of the stored tensors, so a rebuilt model is never larger than the weights
    the file holds; what the stored sizes do not state directly is compared on a model built on the meta device
    (:func:`checked_model_config`). The keys and types ``backbone_kwargs`` may hold at all (plain values, never
    a path) are those of :data:`wsss.config.BACKBONE_KWARGS`, checked when the config is read.

    Raises:
        ValueError: A stated size differs from the stored one, or ``model`` is not a wsss state_dict; one line
            naming ``source``.
    """
    weights = ckpt["model"]
    if not isinstance(weights, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in weights.items()
    ):
        raise ValueError(f"{source}: its 'model' is not a state_dict (parameter name -> tensor); not a wsss checkpoint")
    classes = ckpt.get("classes")
    if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
        raise ValueError(f"{source}: its 'classes' is not a list of class names; not a wsss checkpoint")
    patch_embed, classifier = weights.get(_PATCH_EMBED), weights.get(_CLASSIFIER)
    if patch_embed is None or patch_embed.dim() != 4 or classifier is None or classifier.dim() != 4:
        raise ValueError(
            f"{source}: its weights lack the ViT patch embedding or the decoder classifier ({_PATCH_EMBED}, "
            f"{_CLASSIFIER}); not a wsss checkpoint"
        )
    stored = {
        "embed_dim": patch_embed.shape[0],
        "depth": len({int(m.group(1)) for k in weights if (m := _BLOCK.match(k))}),
        "patch_size": patch_embed.shape[-1] if patch_embed.shape[-1] == patch_embed.shape[-2] else None,
    }
    stated = cfg.model.backbone_kwargs
    differ = [
        f"model.backbone_kwargs.{key}={stated[key]!r} but its weights have {value}"
        for key, value in stored.items()
        if key in stated and stated[key] != value
    ]
    if len(classes) != classifier.shape[0]:
        differ.append(f"{len(classes)} classes but its weights predict {classifier.shape[0]}")
    if differ:
        raise ValueError(
            f"{source}: its config states {'; '.join(differ)}; nothing was built (the file was edited or damaged)"
        )


def _compare_shapes(skeleton: torch.nn.Module, weights: dict[str, torch.Tensor], source: str | Path) -> None:
    """Refuse ``weights`` unless they have exactly the keys and shapes of ``skeleton`` (a meta-device model)."""
    expected = {k: tuple(v.shape) for k, v in skeleton.state_dict().items()}
    stored = {k: tuple(v.shape) for k, v in weights.items()}
    problems = [f"missing {k}" for k in expected if k not in stored]
    problems += [f"unexpected {k}" for k in stored if k not in expected]
    problems += [
        f"{k} stored {stored[k]}, built {shape}" for k, shape in expected.items() if k in stored and stored[k] != shape
    ]
    if problems:
        more = f" and {len(problems) - 3} more" if len(problems) > 3 else ""
        raise ValueError(
            f"{source}: its weights do not fit the model its config builds ({'; '.join(problems[:3])}{more}); "
            "nothing was built; was the file edited or made by another wsss version?"
        )
