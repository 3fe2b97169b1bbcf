"""Checkpoint retention: the newest train.max_keep_ckpts, the best validated one and the last one."""

from __future__ import annotations

import json
import math

import pytest

from tests.conftest import tiny_config, tiny_tagged_config
from wsss.engine.checkpoint import LAST_CHECKPOINT
from wsss.engine.retention import BEST_FILE, CheckpointKeeper
from wsss.engine.train import train
from wsss.model_file import checksum_path


def make_checkpoints(work, steps):
    for s in steps:
        (work / f"iter_{s}.pth").write_bytes(b"x")
    (work / LAST_CHECKPOINT).write_text(f"iter_{steps[-1]}.pth\n")
    (work / "notes.pth").write_bytes(b"not ours")


def seg_keeper(work, max_keep, start):
    """The keeper of a run validated on masks: the best by seg_mIoU."""
    return CheckpointKeeper(work, max_keep=max_keep, start=start, metric="seg_mIoU")


def names(work):
    return sorted(p.name for p in work.glob("*.pth"))


def test_keeps_newest_best_and_last(tmp_path):
    make_checkpoints(tmp_path, [1, 2, 3, 4, 5, 10])
    keeper = seg_keeper(tmp_path, max_keep=2, start=0)
    keeper.mark_best(2, tmp_path / "iter_2.pth", {"seg_mIoU": 40.0})
    removed = keeper.prune()
    assert sorted(p.name for p in removed) == ["iter_1.pth", "iter_3.pth", "iter_4.pth"]
    assert names(tmp_path) == ["iter_10.pth", "iter_2.pth", "iter_5.pth", "notes.pth"]
    assert json.loads((tmp_path / BEST_FILE).read_text()) == {"step": 2, "checkpoint": "iter_2.pth", "seg_mIoU": 40.0}


def test_fewer_than_max_keep_and_keep_all(tmp_path):
    make_checkpoints(tmp_path, [3, 6])
    assert seg_keeper(tmp_path, max_keep=3, start=0).prune() == []
    assert seg_keeper(tmp_path, max_keep=0, start=0).prune() == [tmp_path / "iter_3.pth"]  # the last stays
    make_checkpoints(tmp_path, [1, 2, 3, 4])
    assert seg_keeper(tmp_path, max_keep=-1, start=0).prune() == []


def test_best_record_survives_resume_but_not_an_abandoned_future(tmp_path):
    (tmp_path / BEST_FILE).write_text(json.dumps({"step": 4, "checkpoint": "iter_4.pth", "seg_mIoU": 50.0}))
    resumed = seg_keeper(tmp_path, max_keep=1, start=4)
    assert not resumed.is_best({"seg_mIoU": 49.0}) and resumed.is_best({"seg_mIoU": 51.0})
    assert not resumed.is_best({"seg_mIoU": math.nan})
    assert seg_keeper(tmp_path, max_keep=1, start=3).is_best({"seg_mIoU": 1.0})


@pytest.mark.usefixtures("one_thread")
def test_training_keeps_what_it_should(tiny_voc, tmp_path):
    cfg = tiny_config(tiny_voc, max_iters=6, ckpt_interval=1, val_interval=2, max_keep_ckpts=2, val_max_images=1)
    train(cfg, work_dir=tmp_path, device="cpu")
    rows = [json.loads(line) for line in (tmp_path / "scalars.jsonl").read_text().splitlines()]
    val = {r["step"]: r["val/seg_mIoU"] for r in rows if "val/seg_mIoU" in r}
    assert sorted(val) == [2, 4, 6]
    best_step = max(val, key=lambda s: (val[s], -s))  # the first of equal values stays best
    best = json.loads((tmp_path / BEST_FILE).read_text())
    assert best["step"] == best_step and best["seg_mIoU"] == val[best_step]
    assert names(tmp_path) == sorted({"iter_5.pth", "iter_6.pth", f"iter_{best_step}.pth"})
    checksums = sorted(p.name for p in tmp_path.glob("*.pth.sha256"))
    assert checksums == sorted(checksum_path(tmp_path / n).name for n in names(tmp_path))


@pytest.mark.usefixtures("one_thread")
def test_tag_only_run_keeps_the_best_by_cls_map(tiny_tagged, tmp_path):
    """Without masks there is no seg_mIoU: the best checkpoint is the one of the highest classification mAP."""
    cfg = tiny_tagged_config(tiny_tagged, max_iters=6, ckpt_interval=1, val_interval=2, max_keep_ckpts=1)
    train(cfg, work_dir=tmp_path, device="cpu")
    rows = [json.loads(line) for line in (tmp_path / "scalars.jsonl").read_text().splitlines()]
    val = {r["step"]: r["val/cls_mAP"] for r in rows if "val/cls_mAP" in r}
    assert sorted(val) == [2, 4, 6]
    best_step = max(val, key=lambda s: (val[s], -s))
    best = {"step": best_step, "checkpoint": f"iter_{best_step}.pth", "cls_mAP": val[best_step]}
    assert json.loads((tmp_path / BEST_FILE).read_text()) == best
    assert names(tmp_path) == sorted({"iter_6.pth", f"iter_{best_step}.pth"})


def test_a_best_record_of_another_metric_is_not_compared(tmp_path):
    """A run resumed with a val set of the other kind (masks added or removed) starts its best record afresh."""
    (tmp_path / BEST_FILE).write_text(json.dumps({"step": 4, "checkpoint": "iter_4.pth", "seg_mIoU": 50.0}))
    keeper = CheckpointKeeper(tmp_path, max_keep=1, start=4, metric="cls_mAP")
    assert keeper.is_best({"cls_mAP": 1.0}) and not keeper.is_best({"seg_mIoU": 99.0})


def test_a_deleted_checkpoint_takes_its_checksum_along(tmp_path):
    make_checkpoints(tmp_path, [1, 2, 3])
    for step in (1, 2, 3):
        checksum_path(tmp_path / f"iter_{step}.pth").write_text("0" * 64 + "\n")
    checksum_path(tmp_path / "iter_0.pth").write_text("0" * 64 + "\n")  # left by an older version's pruning
    assert seg_keeper(tmp_path, max_keep=1, start=0).prune() == [tmp_path / "iter_1.pth", tmp_path / "iter_2.pth"]
    assert sorted(p.name for p in tmp_path.glob("*.sha256")) == ["iter_3.pth.sha256"]
