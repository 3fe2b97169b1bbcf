"""Resume: weights and moments from the checkpoint, the learning-rate schedule from the current config."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import tiny_config
from tools import train as train_cli
from wsss.config import dump_config
from wsss.data.labels import labels_from_masks, save_labels
from wsss.engine.checkpoint import LAST_CHECKPOINT
from wsss.engine.resume import config_changes, restore_training_state
from wsss.engine.schedule import PolyWarmupScheduler, lr_factor
from wsss.engine.train import train
from wsss.model_file import load_checkpoint
from wsss.models import build_model

pytestmark = pytest.mark.usefixtures("one_thread")

REPO = Path(__file__).resolve().parents[2]


def _optimizer_for(cfg):
    """Model, AdamW and scheduler built from ``cfg`` as the training loop builds them."""
    model = build_model(cfg.model, num_classes=3)
    o = cfg.optim
    groups = model.param_groups(o.lr, o.head_lr_mult, o.weight_decay, o.no_decay_1d)
    optimizer = torch.optim.AdamW(groups, betas=o.betas)
    scheduler = PolyWarmupScheduler(optimizer, cfg.train.max_iters, o.warmup_iters, o.warmup_ratio, o.power)
    return model, optimizer, scheduler


def _rates(optimizer) -> dict[str, float]:
    return {g["name"]: g["lr"] for g in optimizer.param_groups}


def test_extending_a_finished_run_follows_the_new_schedule(tiny_voc, tmp_path, capsys):
    work = tmp_path / "w"
    train(tiny_config(tiny_voc, max_iters=4, ckpt_interval=4), work_dir=work, device="cpu")
    longer = tiny_config(tiny_voc, max_iters=8, ckpt_interval=4)
    res = train(longer, work_dir=work, resume=True, device="cpu")
    assert res.step == 8
    out = capsys.readouterr().out
    assert "train.max_iters: 4 -> 8" in out and "new schedule from iteration 4" in out
    a, b = load_checkpoint(work / "iter_4.pth"), load_checkpoint(work / "iter_8.pth")
    params = {name for name, _ in res.model.named_parameters()}
    moved = [k for k in params if not torch.equal(a["model"][k], b["model"][k])]
    assert len(moved) > len(params) // 2  # at lr 0 (the old scheduler's end) nothing would move

    # The rates right after resuming are those of the new config at iteration 4.
    model, optimizer, scheduler = _optimizer_for(longer)
    assert restore_training_state(a, work / "iter_4.pth", model, optimizer, scheduler, a["classes"]) == 4
    o = longer.optim
    factor = lr_factor(4, 8, o.warmup_iters, o.warmup_ratio, o.power)
    assert factor > 0.5
    assert factor * o.lr == pytest.approx(_rates(optimizer)["backbone"])
    assert factor * o.lr * o.head_lr_mult == pytest.approx(_rates(optimizer)["heads"])


def test_a_changed_learning_rate_applies_on_resume(tiny_voc, tmp_path):
    work = tmp_path / "w"
    train(tiny_config(tiny_voc, max_iters=6), work_dir=work, device="cpu")
    ckpt = load_checkpoint(work / "iter_3.pth")
    cfg = tiny_config(tiny_voc, max_iters=6)
    cfg.optim.lr, cfg.optim.weight_decay = 3e-4, 0.05
    model, optimizer, scheduler = _optimizer_for(cfg)
    restore_training_state(ckpt, work / "iter_3.pth", model, optimizer, scheduler, ckpt["classes"])
    factor = lr_factor(3, 6, cfg.optim.warmup_iters, cfg.optim.warmup_ratio, cfg.optim.power)
    assert _rates(optimizer)["backbone"] == pytest.approx(3e-4 * factor)
    assert _rates(optimizer)["heads"] == pytest.approx(3e-4 * cfg.optim.head_lr_mult * factor)
    assert {g["weight_decay"] for g in optimizer.param_groups} == {0.05}
    # the moments do come from the checkpoint
    state = next(iter(optimizer.state.values()))
    assert int(state["step"]) == 3 and state["exp_avg"].abs().sum() > 0
    assert config_changes(ckpt["config"], cfg) == ["optim.lr: 0.001 -> 0.0003", "optim.weight_decay: 0.01 -> 0.05"]


@pytest.mark.slow
def test_runs_killed_at_random_moments_resume_to_identical_weights(tiny_voc, tmp_path):
    """tools/train.py SIGKILLed shortly after each new checkpoint (sometimes mid-write), resumed each time: the
    final weights equal those of an uninterrupted run, bit for bit."""
    cfg = tiny_config(tiny_voc, max_iters=10, ckpt_interval=2)
    full = load_checkpoint(train(cfg, work_dir=tmp_path / "full", device="cpu").checkpoint)
    cfg_file = tmp_path / "cfg.py"
    dump_config(cfg, cfg_file)
    work, marker, rng, kills = tmp_path / "killed", tmp_path / "killed" / LAST_CHECKPOINT, random.Random(0), 0
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "tools/train.py", str(cfg_file), "--work-dir", str(work), "--resume", "--device", "cpu"]
    for _ in range(12):
        seen = marker.read_text() if marker.exists() else None
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        while proc.poll() is None and (marker.read_text() if marker.exists() else None) == seen:
            time.sleep(0.02)
        if proc.poll() is None:
            time.sleep(rng.uniform(0.0, 0.03))  # an iteration takes ~0.03 s
            proc.kill()
            kills += proc.wait() == -signal.SIGKILL
            continue
        assert proc.returncode == 0, proc.stderr.read()[-2000:]
        break
    assert kills >= 2 and proc.returncode == 0
    resumed = load_checkpoint(work / "iter_10.pth")
    for k in full["model"]:
        assert torch.equal(full["model"][k], resumed["model"][k]), k


def test_resuming_with_other_classes_names_both_lists(tiny_voc, tmp_path, capsys):
    work = tmp_path / "w"
    train(tiny_config(tiny_voc, max_iters=3), work_dir=work, device="cpu")
    capsys.readouterr()
    four = ["background", "cat", "dog", "bird"]
    (tiny_voc / "classes.txt").write_text("\n".join(four) + "\n")
    save_labels(tiny_voc / "cls_labels.json", labels_from_masks(tiny_voc / "SegmentationClass", 4), four)
    cfg_file = tmp_path / "cfg.py"
    dump_config(tiny_config(tiny_voc, max_iters=6), cfg_file)
    assert train_cli.main([str(cfg_file), "--work-dir", str(work), "--resume", "--device", "cpu"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and "edited" not in err[0]
    assert err[0].startswith(f"error: {work / 'iter_3.pth'}: ")
    assert "['background', 'cat', 'dog']" in err[0] and "['background', 'cat', 'dog', 'bird']" in err[0]
