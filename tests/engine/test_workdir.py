"""Work-dir protection: one run per work dir (flock), no silent fresh start over checkpoints, stale temporaries."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from tests.conftest import tiny_config
from tools import train as train_cli
from wsss.config import dump_config
from wsss.engine.checkpoint import LAST_CHECKPOINT, load_checkpoint
from wsss.engine.train import train
from wsss.engine.workdir import LOCK_FILE, WorkDirError, claim_work_dir

pytestmark = pytest.mark.usefixtures("one_thread")


def test_a_second_run_in_a_held_work_dir_is_refused(tiny_voc, tmp_path, capsys):
    work = tmp_path / "w"
    cfg_file = tmp_path / "cfg.py"
    dump_config(tiny_config(tiny_voc, max_iters=2), cfg_file)
    with claim_work_dir(work, None, False):  # another open of the lock file, as another process would hold it
        assert train_cli.main([str(cfg_file), "--work-dir", str(work), "--device", "cpu"]) == 2
        assert train_cli.main([str(cfg_file), "--work-dir", str(work), "--resume", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    holder = f"pid {os.getpid()} host {socket.gethostname()}"
    assert err.count(f"error: {work} is in use by another training run ({holder}, see {work / LOCK_FILE})") == 2
    assert not list(work.glob("*.pth"))
    # the lock goes with its holder: now the run goes ahead
    assert train_cli.main([str(cfg_file), "--work-dir", str(work), "--device", "cpu"]) == 0
    assert (work / LOCK_FILE).read_text() == f"{holder}\n" and (work / "iter_2.pth").is_file()


def test_the_lock_is_released_when_the_run_fails(tmp_path):
    with pytest.raises(KeyError), claim_work_dir(tmp_path, None, False):
        raise KeyError("boom")
    with claim_work_dir(tmp_path, None, False), pytest.raises(WorkDirError, match="in use"):
        claim_work_dir(tmp_path, None, False).__enter__()


def test_a_fresh_start_over_checkpoints_needs_resume_or_overwrite(tiny_voc, tmp_path, capsys):
    work = tmp_path / "w"
    train(tiny_config(tiny_voc), work_dir=work, device="cpu")
    kept = {p.name: p.read_bytes() for p in work.glob("iter_*.pth")}
    assert set(kept) == {"iter_3.pth", "iter_6.pth"}
    (work / LAST_CHECKPOINT).unlink()  # checkpoints without the marker are protected as well
    with pytest.raises(WorkDirError, match="holds checkpoints of an earlier run .*iter_6.pth.*--resume.*--overwrite"):
        train(tiny_config(tiny_voc, max_iters=2, ckpt_interval=2), work_dir=work, device="cpu")
    assert {p.name: p.read_bytes() for p in work.glob("iter_*.pth")} == kept

    res = train(tiny_config(tiny_voc, max_iters=2, ckpt_interval=2), work_dir=work, device="cpu", overwrite=True)
    assert "deleted 2 checkpoint(s)" in capsys.readouterr().out
    assert sorted(p.name for p in work.glob("iter_*.pth*")) == ["iter_2.pth", "iter_2.pth.sha256"]
    assert load_checkpoint(res.checkpoint)["step"] == 2


def test_stale_temporaries_of_killed_writes_are_removed_at_start(tiny_voc, tmp_path):
    work = tmp_path / "w"
    work.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = work / f".iter_3.pth.{int(dead.stdout)}.k2j4h_x1.tmp"
    live = work / f".iter_3.pth.{os.getpid()}.abcdefgh.tmp"
    stale.write_bytes(b"half a checkpoint")
    live.write_bytes(b"being written")
    train(tiny_config(tiny_voc, max_iters=1, ckpt_interval=1), work_dir=work, device="cpu")
    assert not stale.exists() and live.exists()
