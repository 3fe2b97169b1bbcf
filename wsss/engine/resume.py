"""Resuming a run: weights, optimiser moments and the iteration come from the checkpoint, the schedule from the
config.

The learning rate of a resumed run is rebuilt from the current config at the resumed iteration, never taken
from the checkpoint: ``--resume --cfg-options train.max_iters=120000`` after an 80k run continues on the poly
schedule of 120k (not at the finished run's rate of 0), and a changed ``optim.lr`` (or any other ``optim.*``
hyperparameter) applies from the resumed iteration on. With an unchanged config the rates are exactly
those of an uninterrupted run.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from wsss.config import Config, to_dict
from wsss.engine.checkpoint import check_resumable, load_resume_checkpoint
from wsss.engine.schedule import PolyWarmupScheduler
from wsss.model_file import load_checkpoint, load_weights

SCHEDULE_SECTIONS = ("optim", "train")
"""Config sections whose changes since a checkpoint a resumed run reports."""

__all__ = ["SCHEDULE_SECTIONS", "config_changes", "find_checkpoint", "restore_training_state"]


def find_checkpoint(
    work_dir: Path, resume: str | Path | bool | None, map_location: str | torch.device = "cpu"
) -> tuple[Path, dict[str, Any]] | None:
    """The checkpoint to resume from and its contents: ``resume`` itself when a path, the work dir's newest
    valid one when True (:func:`wsss.engine.checkpoint.load_resume_checkpoint`), None for a fresh start.

    Raises:
        ValueError: The checkpoint cannot be read, or holds a NaN or inf
            (:func:`~wsss.engine.checkpoint.check_resumable`).
    """
    if resume is True:
        return load_resume_checkpoint(work_dir, map_location)
    if resume:
        return Path(resume), check_resumable(load_checkpoint(resume, map_location), resume)
    return None


def restore_training_state(
    ckpt: dict[str, Any],
    source: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: PolyWarmupScheduler,
    classes: Sequence[str],
) -> int:
    """Load a checkpoint's weights and optimiser moments, and put the scheduler (built from the current
    config) at the checkpoint's iteration; returns that iteration.

    The optimiser groups keep the hyperparameters they were built with from the config (base lr, betas,
    weight decay); only the per-parameter state (AdamW moments, step counts) comes from the checkpoint.

    Args:
        ckpt: What :func:`find_checkpoint` loaded.
        source: The checkpoint's path (named in errors).
        model: The model built from the current config.
        optimizer: Its optimiser.
        scheduler: Its scheduler, built from the current config.
        classes: The class names of the current data, background first; the checkpoint's must be the same.

    Raises:
        ValueError: The checkpoint was trained on other classes (both lists named), or its weights or its
            optimiser state do not fit the model (the message names ``source``).
    """
    if list(ckpt["classes"]) != list(classes):
        raise ValueError(
            f"{source}: trained on {len(ckpt['classes'])} classes {list(ckpt['classes'])}, but the config's data "
            f"has {len(classes)} classes {list(classes)}; resume with the data (data.classes) it was trained on, "
            "or start a new run (another --work-dir, or --overwrite)"
        )
    load_weights(model, ckpt["model"], source)
    configured = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
    try:
        optimizer.load_state_dict(ckpt["optimizer"])
    except (KeyError, ValueError) as err:
        raise ValueError(f"{source}: its optimiser state does not fit this model ({err})") from None
    for group, hyper in zip(optimizer.param_groups, configured, strict=True):
        group.update(hyper)
    step = int(ckpt["step"])
    scheduler.resume_at(step)
    return step


def config_changes(old: dict[str, Any], cfg: Config, sections: tuple[str, ...] = SCHEDULE_SECTIONS) -> list[str]:
    """``key: old -> new`` for every value of ``sections`` that differs between a checkpoint's stored config
    ``old`` and ``cfg``."""
    new = to_dict(cfg)
    changes = []
    for section in sections:
        before, after = old.get(section, {}), new[section]
        for key in after:
            if _plain(before.get(key)) != _plain(after[key]):
                changes.append(f"{section}.{key}: {before.get(key)!r} -> {after[key]!r}")
    return changes


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value
