"""What a run leaves in its work dir: log.txt, scalars.jsonl, TensorBoard; the start summary and the
chance-level warning."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from tests.conftest import tiny_config, tiny_tagged_config
from wsss.engine.checkpoint import LAST_CHECKPOINT
from wsss.engine.logger import chance_warning, start_summary
from wsss.engine.train import train

pytestmark = pytest.mark.usefixtures("one_thread")


def read_rows(work):
    return [json.loads(line) for line in (work / "scalars.jsonl").read_text().splitlines()]


def test_work_dir_log_scalars_and_tensorboard(tiny_voc, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = tiny_config(tiny_voc, max_iters=4, val_interval=4, log_interval=2)
    result = train(cfg, work_dir=tmp_path, device="cpu")
    rows = read_rows(tmp_path)
    assert [r["step"] for r in rows] == [2, 4]  # one object per logged iteration, val merged into it
    for row, hist in zip(rows, result.history, strict=True):
        assert row["loss/total"] == pytest.approx(hist["loss"]) and row["loss/cls"] == pytest.approx(hist["cls"])
        assert row["lr/heads"] == pytest.approx(cfg.optim.head_lr_mult * row["lr/backbone"])
    last = rows[-1]
    assert last["val/seg_mIoU"] == pytest.approx(result.val.metrics["seg_mIoU"], nan_ok=True)
    assert {"val/seg_aAcc", "val/seg_mAcc", "val/cam_aAcc", "val_IoU_seg/cat", "val_IoU_cam/dog"} <= last.keys()

    log = (tmp_path / "log.txt").read_text()
    params = sum(p.numel() for p in result.model.parameters()) / 1e6
    for line in ("device      cpu", "classes     3 (background, cat, dog)", "3 train images, 2 val images",
                 f"labels      {tiny_voc / 'cls_labels.json'}", f"parameters  {params:.2f} M", "iter 4/4",
                 "[iter 4] val: cam_mIoU"):  # fmt: skip
        assert line in log, line

    events = EventAccumulator(str(tmp_path / "tb")).Reload()
    tags = events.Tags()
    assert {"loss/total", "lr/backbone", "lr/heads", "val/seg_aAcc", "val/seg_mAcc", "val_IoU_seg/dog"} <= set(
        tags["scalars"]
    )
    assert {"val/b1", "val/b2"} <= set(tags["images"])


def test_tag_only_run_logs_each_class_ap(tiny_tagged, tmp_path):
    """A val set without masks: mAP, F1 and each class's AP in log.txt, scalars.jsonl and TensorBoard, as pre-training
    reports them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = tiny_tagged_config(tiny_tagged, max_iters=2, val_interval=2)
    metrics = train(cfg, work_dir=tmp_path, device="cpu").val.metrics
    assert {"AP_cat", "AP_dog"} <= metrics.keys()
    last = read_rows(tmp_path)[-1]
    expected = {"val/cls_mAP": metrics["cls_mAP"], "val/cls_F1": metrics["cls_F1"],
                "val_AP/cat": metrics["AP_cat"], "val_AP/dog": metrics["AP_dog"]}  # fmt: skip
    assert {k: last[k] for k in expected} == pytest.approx(expected)
    log = (tmp_path / "log.txt").read_text()
    assert f"AP_cat {metrics['AP_cat']:.2f}  AP_dog {metrics['AP_dog']:.2f}" in log, log
    assert set(expected) <= set(EventAccumulator(str(tmp_path / "tb")).Reload().Tags()["scalars"])


def test_resume_keeps_one_line_per_step(tiny_voc, tmp_path):
    cfg = tiny_config(tiny_voc, max_iters=3, ckpt_interval=3)
    train(cfg, work_dir=tmp_path, device="cpu")
    with open(tmp_path / "scalars.jsonl", "a") as f:  # what an interrupted run past the checkpoint leaves
        f.write(json.dumps({"step": 5, "loss/total": 9.0}) + "\n")
    train(tiny_config(tiny_voc, max_iters=6, ckpt_interval=3), work_dir=tmp_path, resume=True, device="cpu")
    assert [r["step"] for r in read_rows(tmp_path)] == [1, 2, 3, 4, 5, 6]
    assert read_rows(tmp_path)[4]["loss/total"] != 9.0
    assert (tmp_path / "log.txt").read_text().count("run starts at iteration") == 2


@pytest.mark.parametrize(
    ("world_size", "expected"),
    [(1, "global batch 2 (2 per process x 1 process)"), (4, "global batch 8 (2 per process x 4 processes)")],
)
def test_start_summary_states_the_global_batch(world_size, expected):
    cfg = tiny_config(".")  # train.batch_size 2 is per process: torchrun multiplies it by the world size
    summary = start_summary(cfg, torch.device("cpu"), world_size, {"train": 3}, ["background", "cat"],
                            Path(cfg.data.label_file), torch.nn.Linear(2, 2))  # fmt: skip
    line = next(line for line in summary.splitlines() if line.startswith("schedule"))
    assert line == f"schedule    {cfg.train.max_iters} iterations, {expected}, warm-up {cfg.optim.warmup_iters}"


@pytest.mark.parametrize(("options", "expected"), [
    ({}, "forward pass float32, CAM pass float32, float32 products tf32"),
    ({"amp": True, "cam_dtype": "bfloat16", "fp32_precision": "ieee"},
     "forward pass bf16 autocast, CAM pass bf16 autocast, float32 products ieee"),
    ({"cam_dtype": "bfloat16"}, "forward pass float32, CAM pass bf16 autocast, float32 products tf32"),
])  # fmt: skip
def test_start_summary_states_the_step_s_precision_on_a_gpu(options, expected):
    """On CUDA the summary says how the step computes (the reference's float32 with TF32 products by default); a
    CPU computes float32 whatever the config says, and the summary says nothing of it."""
    cfg = tiny_config(".", **{"fp32_precision": "tf32", **options})
    args = (1, {"train": 3}, ["background", "cat"], Path(cfg.data.label_file), torch.nn.Linear(2, 2))
    lines = start_summary(cfg, torch.device("cuda"), *args).splitlines()
    assert [line for line in lines if line.startswith("precision")] == [
        f"precision   {expected} (docs/reference.md rows 5, 21, 22)"]  # fmt: skip
    assert not any(line.startswith("precision") for line in start_summary(cfg, torch.device("cpu"), *args).splitlines())


def test_chance_warning():
    cfg = tiny_config(".")
    chance = math.log(2)
    assert chance_warning(0.2, 2500, cfg) is None
    assert chance_warning(0.95 * cfg.train.chance_loss_ratio * chance, 2500, cfg) is None
    message = chance_warning(chance, 2500, cfg)
    assert message.startswith("warning: after 2500 iterations") and "not learning" in message


def test_chance_warning_once_after_warmup(tiny_voc, tmp_path, capsys):
    cfg = tiny_config(tiny_voc, max_iters=5, chance_loss_ratio=0.0)  # any loss counts as chance here
    train(cfg, work_dir=tmp_path, device="cpu")
    log = (tmp_path / "log.txt").read_text()
    assert log.count("warning: after") == 1 and "warning: after 2 iterations (warm-up 2)" in log
    assert "warning: after 2 iterations" in capsys.readouterr().out
    cfg = tiny_config(tiny_voc, max_iters=5, chance_loss_ratio=10.0)
    train(cfg, work_dir=tmp_path / "ok", device="cpu")
    assert "warning: after" not in (tmp_path / "ok" / "log.txt").read_text()


def tensorboard_steps(work) -> dict[str, list[int]]:
    """The steps of each scalar TensorBoard shows for ``work/tb`` (abandoned tails purged as it purges them)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(work / "tb")).Reload()
    return {tag: [e.step for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def jsonl_steps(work) -> dict[str, list[int]]:
    """The steps of each scalar in scalars.jsonl."""
    steps: dict[str, list[int]] = {}
    for row in read_rows(work):
        for key in row.keys() - {"step"}:
            steps.setdefault(key, []).append(row["step"])
    return steps


def test_tensorboard_keeps_the_resume_step(tiny_voc, tmp_path):
    """Killed after iteration 3 with its last checkpoint at 2, resumed from 2: TensorBoard hides the abandoned
    step 3 and keeps step 2, as scalars.jsonl does."""
    train(tiny_config(tiny_voc, max_iters=3, ckpt_interval=2, val_interval=2), work_dir=tmp_path, device="cpu")
    longer = tiny_config(tiny_voc, max_iters=6, ckpt_interval=2, val_interval=2)
    train(longer, work_dir=tmp_path, resume=str(tmp_path / "iter_2.pth"), device="cpu")
    tb, jsonl = tensorboard_steps(tmp_path), jsonl_steps(tmp_path)
    assert jsonl["val/seg_mIoU"] == [2, 4, 6] and jsonl["loss/total"] == [1, 2, 3, 4, 5, 6]
    assert tb == jsonl


def test_tensorboard_after_a_resume_from_zero_has_each_step_once(tiny_voc, tmp_path):
    """Killed before its first checkpoint and resumed (from iteration 0): no step twice in TensorBoard."""
    train(tiny_config(tiny_voc, max_iters=2, ckpt_interval=2, val_interval=2), work_dir=tmp_path, device="cpu")
    for path in [*tmp_path.glob("iter_*"), tmp_path / LAST_CHECKPOINT]:  # as if killed before saving
        path.unlink()
    train(tiny_config(tiny_voc, max_iters=3, val_interval=3), work_dir=tmp_path, resume=True, device="cpu")
    tb, jsonl = tensorboard_steps(tmp_path), jsonl_steps(tmp_path)
    assert jsonl["loss/total"] == [1, 2, 3] and jsonl["val/seg_mIoU"] == [3]
    assert tb == jsonl
