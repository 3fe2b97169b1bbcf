"""Workers die with their parent (SIGKILL of the parent), SIGTERM unwinds like Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc"), pytest.mark.slow]

WORKERS = textwrap.dedent("""
    import functools, os, sys, time
    from torch.utils.data import DataLoader, Dataset
    from wsss.config import CrfConfig
    from wsss.inference.crf import CrfPool
    from wsss.utils.lifetime import die_with_parent, exit_on_sigterm

    class Busy(Dataset):  # a worker stuck on one huge image
        def __len__(self):
            return 2
        def __getitem__(self, i):
            time.sleep(600)
            return i

    exit_on_sigterm()
    with CrfPool(CrfConfig(backend="pydensecrf", workers=2)):  # the backend with worker processes
        loader = iter(DataLoader(Busy(), num_workers=1, worker_init_fn=functools.partial(die_with_parent, os.getpid())))
        print("ready", flush=True)
        next(loader)
""")


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _start() -> tuple[subprocess.Popen, list[int]]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", WORKERS], stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + 30
    while len(workers := _children(proc.pid)) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(workers) >= 3, workers  # two CRF workers and a decoding worker
    return proc, workers


def _wait_gone(pids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while (left := [p for p in pids if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def test_workers_die_when_their_parent_is_killed():
    proc, workers = _start()
    proc.kill()
    proc.wait(timeout=30)
    left = _wait_gone(workers, 10)
    for pid in left:  # do not leave them behind if the test fails
        os.kill(pid, signal.SIGKILL)
    assert not left


def test_sigterm_unwinds_and_stops_the_workers():
    proc, workers = _start()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 143
    left = _wait_gone(workers, 10)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left
