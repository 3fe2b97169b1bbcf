"""Training loop: exact resume, NaN stop, 2-process DDP on CPU, CLI smoke; a tiny ViT on the tiny dataset."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tests.conftest import record_at_calls, tf32_flags, tiny_config
from tools import train as train_cli
from wsss.config import dump_config
from wsss.engine.checkpoint import LAST_CHECKPOINT
from wsss.engine.optim import NonFiniteLossError
from wsss.engine.step import TrainingStep
from wsss.engine.train import train
from wsss.model_file import load_checkpoint

REPO = Path(__file__).resolve().parents[2]


def test_resume_is_exact(tiny_voc, tmp_path):
    cfg = tiny_config(tiny_voc)
    full = train(cfg, work_dir=tmp_path / "full", device="cpu")
    assert full.step == 6 and full.checkpoint == tmp_path / "full" / "iter_6.pth"
    assert {"seg", "reg"} <= set(full.history[-1])  # the dense losses ran after seg_start_iter
    resumed = train(tiny_config(tiny_voc), work_dir=tmp_path / "resumed", resume=str(tmp_path / "full" / "iter_3.pth"),
                    device="cpu")  # fmt: skip
    a = load_checkpoint(full.checkpoint)
    b = load_checkpoint(resumed.checkpoint)
    assert a["step"] == b["step"] == 6
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    # ...while a run from another seed does differ (the comparison above can fail)
    other = train(tiny_config(tiny_voc, seed=1), work_dir=tmp_path / "other", device="cpu")
    c = load_checkpoint(other.checkpoint)
    assert not all(torch.equal(a["model"][k], c["model"][k]) for k in a["model"])


def test_resume_is_exact_when_validating_at_the_checkpoint(tiny_voc, tmp_path):
    """The checkpoint is saved before the validation of its iteration (which must not change the random state),
    so a resume from it continues exactly."""
    full = train(tiny_config(tiny_voc, val_interval=3), work_dir=tmp_path / "full", device="cpu")
    resumed = train(tiny_config(tiny_voc, val_interval=3), work_dir=tmp_path / "resumed", device="cpu",
                    resume=str(tmp_path / "full" / "iter_3.pth"))  # fmt: skip
    a, b = load_checkpoint(full.checkpoint), load_checkpoint(resumed.checkpoint)
    assert a["step"] == b["step"] == 6
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k


@pytest.mark.parametrize("mode", ["tf32", "ieee"])
def test_a_run_computes_float32_products_as_the_config_says(tiny_voc, tmp_path, monkeypatch, mode):
    """``train.fp32_precision`` holds for every step of the run (the flags a GPU's cuBLAS and cuDNN read; the CPU
    ignores them), and the process's own setting comes back after it."""
    seen, before = record_at_calls(monkeypatch, TrainingStep, "__call__"), tf32_flags()
    train(tiny_config(tiny_voc, max_iters=2, fp32_precision=mode), work_dir=tmp_path / "w", device="cpu")
    assert len(seen) == 2 and set(seen) == {(mode == "tf32",) * 2}
    assert tf32_flags() == before


def test_checkpoint_is_self_describing(tiny_voc, tmp_path):
    cfg = tiny_config(tiny_voc, max_iters=3)
    res = train(cfg, work_dir=tmp_path / "w", device="cpu")
    ckpt = load_checkpoint(res.checkpoint)
    assert ckpt["classes"] == ["background", "cat", "dog"]
    assert ckpt["config"]["train"]["max_iters"] == 3
    assert len(ckpt["mean"]) == 3 and ckpt["git_commit"]
    assert not any(k.startswith("module.") for k in ckpt["model"])
    assert (tmp_path / "w" / LAST_CHECKPOINT).read_text().strip() == "iter_3.pth"
    from wsss.model_file import model_from_checkpoint

    model, _ = model_from_checkpoint(res.checkpoint)
    x = torch.randn(1, 3, 40, 48)
    assert model(x).seg.shape == (1, 3, 5, 6)
    from wsss.config import load_config

    assert load_config(tmp_path / "w" / "config.py") == dataclasses.replace(cfg, work_dir=str(tmp_path / "w"))


def test_nan_loss_stops_and_keeps_last_checkpoint(tiny_voc, tmp_path, capsys):
    cfg = tiny_config(tiny_voc, max_iters=3)
    work = tmp_path / "w"
    train(cfg, work_dir=work, device="cpu")
    before = (work / "iter_3.pth").read_bytes()
    cfg_file = tmp_path / "cfg.py"
    cfg.train.max_iters = 6
    cfg.loss.aux_weight = 1e39  # a config refuses NaN; this finite weight overflows float32 to an infinite loss
    dump_config(cfg, cfg_file)
    rc = train_cli.main([str(cfg_file), "--work-dir", str(work), "--resume", "--device", "cpu"])
    assert rc == 1
    err = capsys.readouterr().err
    assert "non-finite loss or gradient at iteration 3" in err and "iter_3.pth" in err
    assert (work / "iter_3.pth").read_bytes() == before
    assert (work / LAST_CHECKPOINT).read_text().strip() == "iter_3.pth"
    assert not (work / "iter_6.pth").exists()
    with pytest.raises(NonFiniteLossError):
        train(cfg, work_dir=tmp_path / "fresh", device="cpu")


def test_cli_resume_without_value_continues(tiny_voc, tmp_path, capsys):
    cfg_file = tmp_path / "cfg.py"
    cfg = tiny_config(tiny_voc, max_iters=3)
    dump_config(cfg, cfg_file)
    work = tmp_path / "w"
    assert train_cli.main([str(cfg_file), "--work-dir", str(work), "--device", "cpu"]) == 0
    opts = ["--cfg-options", "train.max_iters=4"]
    assert train_cli.main([str(cfg_file), "--work-dir", str(work), "--resume", "--device", "cpu", *opts]) == 0
    out = capsys.readouterr().out
    assert "resuming from" in out and "iter_3.pth" in out and "final val: cam_mIoU" in out
    assert load_checkpoint(work / "iter_4.pth")["step"] == 4


BUSY_PORTS = (29500, 29531)
"""torchrun's default port and one a test once hard-coded: held during the run, as another job would hold them."""


def torchrun(*args: str) -> subprocess.CompletedProcess:
    """Two CPU processes under torchrun on a free port (``--standalone``), while :data:`BUSY_PORTS` are taken."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *args]
    with contextlib.ExitStack() as held:
        for port in BUSY_PORTS:
            sock = held.enter_context(socket.socket())
            try:
                sock.bind(("127.0.0.1", port))
                sock.listen()
            except OSError:  # already taken by another job: just as good
                pass
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.mark.slow
def test_ddp_resume_is_exact_with_stochastic_depth(tiny_voc, tmp_path):
    """2 ranks, drop-path on: 4 iterations = 2 + resume + 2, bit for bit (each rank's random state is saved);
    the ranks keep identical weights, log the same rank-averaged losses, and only rank 0 prints."""
    cfg = tiny_config(tiny_voc, max_iters=4, ckpt_interval=2)
    assert cfg.model.drop_path_rate > 0
    cfg.train.batch_size = 1
    cfg.data.num_workers = 1  # a loader worker per rank, kept across epochs (tests/engine/test_loader.py)
    cfg_file = tmp_path / "cfg.py"
    dump_config(cfg, cfg_file)
    script = tmp_path / "run_ddp.py"
    script.write_text(
        textwrap.dedent(f"""
        import json, os, torch
        from wsss.config import load_config
        from wsss.engine.train import train
        res = train(load_config({str(cfg_file)!r}), work_dir={str(tmp_path / "full")!r}, device="cpu")
        rank = os.environ['RANK']
        torch.save(res.model.state_dict(), {str(tmp_path)!r} + f"/rank{{rank}}.pth")
        open({str(tmp_path)!r} + f"/history{{rank}}.json", "w").write(json.dumps(res.history))
    """)
    )
    torchrun(str(script))
    r0 = torch.load(tmp_path / "rank0.pth", weights_only=True)
    r1 = torch.load(tmp_path / "rank1.pth", weights_only=True)
    full = load_checkpoint(tmp_path / "full" / "iter_4.pth")
    assert len(full["rng"]) == 2 and not torch.equal(full["rng"][0]["torch"], full["rng"][1]["torch"])
    for k in r0:
        assert torch.equal(r0[k], r1[k]), k
        assert torch.equal(r0[k], full["model"][k]), k
    h0, h1 = (json.loads((tmp_path / f"history{r}.json").read_text()) for r in (0, 1))
    assert h0 == h1 and len(h0) == 4  # one entry per log interval (1), averaged over the ranks

    resume = str(tmp_path / "full" / "iter_2.pth")
    # one thread per rank, as the script's (torchrun's OMP_NUM_THREADS=1): the tool would take each rank's share of
    # the cores, 7 threads on a 16-core machine, where the resumed weights then differed (2026-11-28)
    proc = torchrun("tools/train.py", str(cfg_file), "--work-dir", str(tmp_path / "resumed"), "--resume", resume,
                    "--device", "cpu", "--threads", "1")  # fmt: skip
    resumed = load_checkpoint(tmp_path / "resumed" / "iter_4.pth")
    for k in full["model"]:
        assert torch.equal(full["model"][k], resumed["model"][k]), k
    assert proc.stdout.count("final val:") == 1 and proc.stdout.count("checkpoint:") == 1, proc.stdout
    assert proc.stdout.count("resuming from") == 1


def test_cli_trains_on_tagged_images_without_masks(tiny_tagged, tmp_path, capsys):
    """The README's "Train on your own tagged images": the shipped config, a folder and its tags.csv, no code."""
    options = [
        f"data.root={tiny_tagged}", "data.val_fraction=0.3", "data.crop_size=32", "data.num_workers=0",
        "model.backbone=vit_tiny_patch16_224", "model.pretrained=", "model.backbone_kwargs.depth=3",
        "model.backbone_kwargs.embed_dim=32", "model.backbone_kwargs.num_heads=2", "model.backbone_kwargs.patch_size=8",
        "model.decoder_channels=16", "model.aux_layer=-2", "cam.scales=[1.0]", "par.num_iter=2", "par.dilations=[1,2]",
        "loss.seg_start_iter=1", "optim.warmup_iters=1", "train.max_iters=2", "train.batch_size=2",
        "train.log_interval=1", "train.val_interval=2", "train.ckpt_interval=2",
    ]  # fmt: skip
    argv = [str(REPO / "configs" / "tagged_centered.py"), "--work-dir", str(tmp_path / "w"), "--device", "cpu"]
    assert train_cli.main(argv + ["--cfg-options", *options]) == 0
    out = capsys.readouterr().out
    assert "cls_mAP" in out and "cls_F1" in out and "mIoU" not in out.split("final val:")[-1]
    assert "note: segmentation mIoU needs masks" in out
    ckpt = load_checkpoint(tmp_path / "w" / "iter_2.pth")
    assert ckpt["classes"] == ["background", "cat", "dog"]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "w" / "tb"), size_guidance={"images": 0})
    events.Reload()
    assert {"val/cls_mAP", "val/cls_F1"} <= set(events.Tags()["scalars"])
    assert len(events.Tags()["images"]) == 4  # image, CAMs of its tags, segmentation: the 4 val images
