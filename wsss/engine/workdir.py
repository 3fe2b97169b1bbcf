"""One training run per work dir, and no silent fresh start over an earlier run's checkpoints.

:func:`claim_work_dir` takes an exclusive ``flock`` on ``WORK/train.lock`` (which names the holder's PID and
host) for the whole run, so a second run in the same work dir stops at once instead of interleaving its
checkpoints with the first's. The kernel releases the lock when the process ends, however it ends. A run
without ``resume`` in a work dir that already holds checkpoints stops too, unless ``overwrite`` is given,
which deletes them first. Temporaries of killed atomic writes are removed at start.
"""

from __future__ import annotations

import fcntl
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from wsss.engine.checkpoint import LAST_CHECKPOINT, checkpoints_newest_first, checksum_path
from wsss.utils.fileio import remove_stale_temporaries

LOCK_FILE = "train.lock"

__all__ = ["LOCK_FILE", "WorkDirError", "claim_work_dir"]


class WorkDirError(ValueError):
    """The work dir is in use by another run, or holds checkpoints a fresh start would overwrite."""


@contextmanager
def claim_work_dir(work: Path, resume: str | Path | bool | None, overwrite: bool) -> Iterator[None]:
    """Hold the work dir's lock while the ``with`` body runs, after checking a fresh start overwrites nothing.

    Args:
        work: The work dir (created if missing).
        resume: The run's resume argument (a path, True, or None/False for a fresh start).
        overwrite: Allow a fresh start over existing checkpoints; they are deleted first.

    Raises:
        WorkDirError: Another process holds the lock, or a fresh start without ``overwrite`` finds checkpoints.
    """
    work.mkdir(parents=True, exist_ok=True)
    fd = os.open(work / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "unknown process"
            raise WorkDirError(
                f"{work} is in use by another training run ({holder}, see {work / LOCK_FILE}); wait for it to end "
                "or pass another --work-dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} host {socket.gethostname()}\n".encode(), 0)
        remove_stale_temporaries(work)
        if not resume:
            _clear_for_fresh_start(work, overwrite)
        yield
    finally:
        os.close(fd)  # releases the lock


def _clear_for_fresh_start(work: Path, overwrite: bool) -> None:
    existing = [p for p in checkpoints_newest_first(work) if p.is_file()]
    if not existing and not (work / LAST_CHECKPOINT).is_file():
        return
    if not overwrite:
        names = ", ".join(p.name for p in existing[:3]) + (" ..." if len(existing) > 3 else "")
        raise WorkDirError(
            f"{work} holds checkpoints of an earlier run ({names or LAST_CHECKPOINT}); pass --resume to continue "
            "it, --overwrite to delete them and start from scratch, or another --work-dir"
        )
    for path in existing:
        checksum_path(path).unlink(missing_ok=True)
        path.unlink()
    (work / LAST_CHECKPOINT).unlink(missing_ok=True)
    print(f"--overwrite: deleted {len(existing)} checkpoint(s) of an earlier run in {work}")
