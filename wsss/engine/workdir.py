"""One training run per work dir, and no silent fresh start over an earlier run's checkpoints.

:func:`claim_work_dir` takes an exclusive ``flock`` on ``WORK/train.lock`` (which names the holder's PID and
host) for the whole run (:func:`wsss.utils.folder_lock.hold_lock`), so a second run in the same work dir stops at
once instead of interleaving its checkpoints with the first's; the file is deleted when the run ends. A run without
``resume`` in a work dir that already holds checkpoints stops too, unless ``overwrite`` is given.
Temporaries of killed atomic writes are removed at start.

Nothing of the earlier run is touched until the new one has checked everything that can fail before its first
step (config, data, model): then :func:`start_afresh` deletes the earlier checkpoints (``overwrite``) and moves
its ``log.txt``, ``scalars.jsonl`` and ``tb/`` into ``earlier_runs/<time>/``, so that the log and TensorBoard
show one run.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from wsss.engine.checkpoint import LAST_CHECKPOINT, checkpoints_newest_first
from wsss.engine.logger import LOG_FILE, SCALARS_FILE, TB_DIR
from wsss.engine.retention import BEST_FILE
from wsss.model_file import checksum_path
from wsss.utils.fileio import remove_stale_temporaries
from wsss.utils.folder_lock import hold_lock

LOCK_FILE = "train.lock"
EARLIER_RUNS = "earlier_runs"
"""Folder of the work dir that a fresh start moves the earlier run's logs into, one subfolder per run."""

__all__ = ["EARLIER_RUNS", "LOCK_FILE", "WorkDirError", "claim_work_dir", "start_afresh"]


class WorkDirError(ValueError):
    """The work dir is in use by another run, or holds checkpoints a fresh start would overwrite."""


@contextmanager
def claim_work_dir(work: Path, resume: str | Path | bool | None, overwrite: bool) -> Iterator[None]:
    """Hold the work dir's lock while the ``with`` body runs, after checking a fresh start overwrites nothing
    without ``overwrite``. Deletes nothing of the earlier run: the run calls :func:`start_afresh` once it is ready
    to start. The lock file is deleted when the body ends, however it ends.

    Args:
        work: The work dir (created if missing).
        resume: The run's resume argument (a path, True, or None/False for a fresh start).
        overwrite: Allow a fresh start over existing checkpoints.

    Raises:
        WorkDirError: Another process holds the lock, or a fresh start without ``overwrite`` finds checkpoints.
    """
    work.mkdir(parents=True, exist_ok=True)
    lock = work / LOCK_FILE

    def in_use(holder: str) -> WorkDirError:
        return WorkDirError(
            f"{work} is in use by another training run ({holder}, see {lock}); wait for it to end or pass another "
            "--work-dir"
        )

    with hold_lock(lock, in_use):
        remove_stale_temporaries(work)
        if not resume:
            _earlier_checkpoints(work, overwrite)
        yield


def start_afresh(work: Path, overwrite: bool) -> list[str]:
    """Clear the work dir for a fresh start: delete the earlier run's checkpoints (with their checksums and the
    last/best markers) and move its log.txt, scalars.jsonl and tb/ into ``earlier_runs/<time>/``.

    Args:
        work: The work dir, whose lock this process holds (:func:`claim_work_dir`).
        overwrite: Whether the run may delete checkpoints.

    Returns:
        What was done, one line each, for the new run's log.

    Raises:
        WorkDirError: The work dir holds checkpoints and ``overwrite`` is not given.
    """
    checkpoints = _earlier_checkpoints(work, overwrite)
    notes = []
    for path in checkpoints:
        checksum_path(path).unlink(missing_ok=True)
        path.unlink()
    (work / LAST_CHECKPOINT).unlink(missing_ok=True)
    (work / BEST_FILE).unlink(missing_ok=True)
    if checkpoints:
        notes.append(f"--overwrite: deleted {len(checkpoints)} checkpoint(s) of an earlier run in {work}")
    logs = [work / name for name in (LOG_FILE, SCALARS_FILE, TB_DIR) if (work / name).exists()]
    if logs:
        names = ", ".join(f"{p.name}/" if p.is_dir() else p.name for p in logs)
        aside = _new_folder(work / EARLIER_RUNS / time.strftime("%Y%m%d-%H%M%S"))
        for path in logs:
            path.rename(aside / path.name)
        notes.append(f"fresh start: moved the earlier run's {names} to {aside}")
    return notes


def _new_folder(path: Path) -> Path:
    """Create ``path``, or ``path-2``, ``path-3``... if it exists; return the one created."""
    candidate, n = path, 1
    while True:
        try:
            candidate.mkdir(parents=True)
            return candidate
        except FileExistsError:
            n += 1
            candidate = path.with_name(f"{path.name}-{n}")


def _earlier_checkpoints(work: Path, overwrite: bool) -> list[Path]:
    """The work dir's checkpoints, which a fresh start may delete only with ``overwrite``."""
    existing = [p for p in checkpoints_newest_first(work) if p.is_file()]
    if (existing or (work / LAST_CHECKPOINT).is_file()) and not overwrite:
        names = ", ".join(p.name for p in existing[:3]) + (" ..." if len(existing) > 3 else "")
        raise WorkDirError(
            f"{work} holds checkpoints of an earlier run ({names or LAST_CHECKPOINT}); pass --resume to continue "
            "it, --overwrite to delete them and start from scratch, or another --work-dir"
        )
    return existing
