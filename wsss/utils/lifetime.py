"""Process lifetime: worker processes that die with their parent, and SIGTERM handled like Ctrl-C.

Decode and CRF workers hold hundreds of MB each. When their parent is killed (SIGKILL, OOM killer, a
cluster's time limit) nothing tells them to stop, and a worker waiting on its job queue or busy with a large
image would live on. :func:`die_with_parent`, run first thing in each worker, asks the kernel to send it
SIGKILL when its parent goes (Linux ``PR_SET_PDEATHSIG``) and, on every platform, starts a thread that exits
the worker once its parent process id changes. :func:`exit_on_sigterm` turns SIGTERM (``kill``, torchrun
stopping a job) into ``SystemExit`` in the main process, so ``with`` blocks and ``finally`` clauses shut the
workers down and release locks as they do on Ctrl-C.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from typing import Any

PARENT_POLL_S = 1.0
"""How often the watch thread checks the parent process id."""

_PR_SET_PDEATHSIG = 1

__all__ = ["PARENT_POLL_S", "die_with_parent", "exit_on_sigterm"]


def die_with_parent(parent: int, *_: Any) -> None:
    """Make this worker process exit when process ``parent`` (the one that started it) ends.

    Pass the parent's pid from the parent, e.g. ``worker_init_fn=functools.partial(die_with_parent,
    os.getpid())`` or ``initializer=die_with_parent, initargs=(os.getpid(),)``: a worker that looked its parent
    up itself, after a parent that died right after starting it, would see its new parent and live on. Further
    arguments (a DataLoader's worker id) are ignored.
    """
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:  # the parent went before the request took effect
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(parent,), name="die-with-parent", daemon=True).start()


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os._exit(1)


def exit_on_sigterm() -> None:
    """In the main thread: SIGTERM raises ``SystemExit(143)`` (128 + 15), which unwinds like KeyboardInterrupt."""
    signal.signal(signal.SIGTERM, _raise_exit)


def _raise_exit(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)
