"""A folder owned by one run: an exclusive ``flock`` on a lock file in it, held while the run writes there.

:func:`hold_lock` is what makes a training work dir (``train.lock``, :mod:`wsss.engine.workdir`) and a pseudo-label
export's OUT (``export.lock``, :mod:`wsss.inference.exports.pseudo_labels`) one run's: a second run stops at once,
naming the
holder's PID and host, instead of interleaving its files with the first's. The file is deleted when the run ends,
finished or failed; the kernel releases the lock when the process ends, however it ends (a killed run leaves the
file, unlocked, and the next run takes it). A run that opened the file just before its holder deleted it sees that
the file it locked is no longer the folder's and takes the new one.
"""

from __future__ import annotations

import fcntl
import os
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["hold_lock"]


@contextmanager
def hold_lock(lock: Path, in_use: Callable[[str], Exception]) -> Iterator[None]:
    """Hold the exclusive lock of the file ``lock`` (created, naming this process's PID and host) while the ``with``
    body runs; delete the file when the body ends, however it ends.

    Args:
        lock: The lock file, in the folder the run owns (which must exist).
        in_use: The error to raise when another process holds the lock, from the holder's line (``pid N host H``).

    Raises:
        Exception: ``in_use(holder)``, at once (never waits).
    """
    fd = _locked_descriptor(lock, in_use)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} host {socket.gethostname()}\n".encode(), 0)
        yield
    finally:
        lock.unlink(missing_ok=True)  # while still locked: a run waiting on this file then sees it gone
        os.close(fd)  # releases the lock


def _locked_descriptor(lock: Path, in_use: Callable[[str], Exception]) -> int:
    """An open descriptor of ``lock`` holding its exclusive ``flock``, taken without waiting."""
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "unknown process"
            os.close(fd)
            raise in_use(holder) from None
        try:
            if os.fstat(fd).st_ino == os.stat(lock).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)  # its holder deleted the file after this open: lock the folder's file anew
