"""Work-dir protection: one run per work dir (flock), no silent fresh start over checkpoints, stale temporaries."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import subprocess
import sys

import pytest

from tests.conftest import tiny_config, tiny_tagged_config
from tools import train as train_cli
from wsss.config import dump_config
from wsss.engine.checkpoint import LAST_CHECKPOINT
from wsss.engine.train import train
from wsss.engine.workdir import LOCK_FILE, WorkDirError, claim_work_dir
from wsss.model_file import load_checkpoint
from wsss.utils.fileio import temporary_prefix

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
    assert (work / "iter_2.pth").is_file() and not (work / LOCK_FILE).exists()  # a finished run takes its lock file


def test_the_lock_file_goes_when_the_run_ends_finished_or_failed(tmp_path):
    with claim_work_dir(tmp_path, None, False):
        assert (tmp_path / LOCK_FILE).read_text() == f"pid {os.getpid()} host {socket.gethostname()}\n"
    assert not (tmp_path / LOCK_FILE).exists()
    with pytest.raises(KeyError), claim_work_dir(tmp_path, None, False):
        raise KeyError("boom")
    assert not (tmp_path / LOCK_FILE).exists()


def test_a_lock_file_deleted_between_open_and_lock_is_not_taken(tmp_path, monkeypatch):
    """A run that opens the lock file just before its holder ends (and deletes it) must not run on the deleted
    file's lock while a third run locks the new file: it locks the work dir's file anew."""
    lock = tmp_path / LOCK_FILE
    holder = claim_work_dir(tmp_path, None, False)
    holder.__enter__()
    real_flock = fcntl.flock

    def holder_ends_first(fd, operation):
        if holder is not None and not ended:
            ended.append(True)
            holder.__exit__(None, None, None)  # deletes the file this run has just opened
        return real_flock(fd, operation)

    ended: list[bool] = []
    monkeypatch.setattr(fcntl, "flock", holder_ends_first)
    with claim_work_dir(tmp_path, None, False):
        assert ended and lock.exists()
        third = os.open(lock, os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):  # a third run finds the work dir's file locked
                real_flock(third, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(third)


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
    stale = work / f"{temporary_prefix('iter_3.pth', int(dead.stdout))}k2j4h_x1.tmp"
    live = work / f"{temporary_prefix('iter_3.pth')}abcdefgh.tmp"
    stale.write_bytes(b"half a checkpoint")
    live.write_bytes(b"being written")
    train(tiny_config(tiny_voc, max_iters=1, ckpt_interval=1), work_dir=work, device="cpu")
    assert not stale.exists() and live.exists()


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("data.val_fraction=0", "no image falls in the 'val' part"),
        ("model.pretrained=missing.pth", "pretrained checkpoint not found"),
    ],
)
def test_overwrite_deletes_nothing_when_the_config_or_data_fail(tiny_tagged, tmp_path, capsys, option, message):
    """--overwrite checks the data and builds the model first: a run that cannot start leaves the earlier one."""
    work, cfg_file = tmp_path / "w", tmp_path / "cfg.py"
    dump_config(tiny_tagged_config(tiny_tagged, max_iters=2, ckpt_interval=1, val_interval=2), cfg_file)
    assert train_cli.main([str(cfg_file), "--work-dir", str(work), "--device", "cpu"]) == 0
    before = {p.relative_to(work): p.read_bytes() for p in work.rglob("*") if p.is_file() and p.name != LOCK_FILE}
    assert {"iter_1.pth", "iter_2.pth", "log.txt", "scalars.jsonl"} <= {p.name for p in before}
    argv = [str(cfg_file), "--work-dir", str(work), "--device", "cpu", "--overwrite", "--cfg-options", option]
    assert train_cli.main(argv) == 2
    assert message in capsys.readouterr().err
    after = {p.relative_to(work): p.read_bytes() for p in work.rglob("*") if p.is_file() and p.name != LOCK_FILE}
    assert after == before


def test_a_fresh_start_moves_the_earlier_runs_logs_aside(tiny_voc, tmp_path, capsys):
    """log.txt, scalars.jsonl and tb/ of the deleted run go to earlier_runs/<time>/, so TensorBoard and the log
    show one run; a fresh start in a work dir without checkpoints (a run that failed early) moves them too."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    work = tmp_path / "w"
    train(tiny_config(tiny_voc, max_iters=3), work_dir=work, device="cpu")
    old = {name: (work / name).read_bytes() for name in ("log.txt", "scalars.jsonl")}
    train(tiny_config(tiny_voc, max_iters=2, ckpt_interval=2), work_dir=work, device="cpu", overwrite=True)
    out = capsys.readouterr().out
    (aside,) = (work / "earlier_runs").iterdir()
    assert f"moved the earlier run's log.txt, scalars.jsonl, tb/ to {aside}" in out
    assert {name: (aside / name).read_bytes() for name in old} == old
    assert len(list((aside / "tb").iterdir())) == len(list((work / "tb").iterdir())) == 1
    assert (work / "log.txt").read_text().count("run starts at iteration") == 1
    assert [json.loads(line)["step"] for line in (work / "scalars.jsonl").read_text().splitlines()] == [1, 2]
    events = EventAccumulator(str(work / "tb")).Reload()
    assert [e.step for e in events.Scalars("loss/total")] == [1, 2]
    assert not (work / "best_checkpoint.json").exists() or "iter_2.pth" in (work / "best_checkpoint.json").read_text()

    for path in work.glob("iter_*"):  # a run that ended before its first checkpoint
        path.unlink()
    (work / LAST_CHECKPOINT).unlink()
    train(tiny_config(tiny_voc, max_iters=1, ckpt_interval=1), work_dir=work, device="cpu")
    assert len(list((work / "earlier_runs").iterdir())) == 2
    assert (work / "log.txt").read_text().count("run starts at iteration") == 1
