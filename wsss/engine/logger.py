"""What a run tells the user and leaves in its work dir: a plain-text log, one JSON line of scalars per logged
iteration, TensorBoard events; the start summary and the chance-level warning.

Work dir contents written here::

    log.txt          everything printed (start summary, losses, validation tables, warnings, skipped images),
                     appended by each resumed run; a fresh start moves the earlier run's log.txt, scalars.jsonl
                     and tb/ to earlier_runs/<time>/ (wsss.engine.workdir)
    scalars.jsonl    {"step": N, "loss/cls": ..., "lr/backbone": ..., "lr/heads": ..., "val/seg_mIoU": ...,
                     "val_IoU_seg/<class>": ...}; a val set with tags only: "val/cls_mAP", "val/cls_F1",
                     "val_AP/<class>"
    tb/              TensorBoard events: the same scalars, labelled validation pictures
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from wsss.config import Config
from wsss.evaluation.metrics import SegMetrics
from wsss.utils.fileio import atomic_write_text

LOG_FILE = "log.txt"
SCALARS_FILE = "scalars.jsonl"
TB_DIR = "tb"


class RunLogger:
    """Writes the work dir's log, scalars and TensorBoard events (rank 0 only; other ranks get a silent one).

    Scalars given for one step are gathered into one JSON object, written when the step is flushed. On resume,
    what the interrupted run logged after ``start`` is dropped, so both read as one run: the lines of later steps
    from scalars.jsonl, and from TensorBoard the events of later steps (purged from ``start + 1`` on; the
    events at ``start`` itself, e.g. the validation saved with the checkpoint, stay, as they do in scalars.jsonl).

    Args:
        work: The work dir.
        start: The iteration the run starts (or resumes) from.
        enabled: False on ranks other than 0.
    """

    def __init__(self, work: Path, start: int, enabled: bool = True) -> None:
        self.enabled = enabled
        self.pending: dict[str, float] = {}
        self.step = start
        self.writer = None
        if not enabled:
            return
        self.log_path, self.scalars_path = work / LOG_FILE, work / SCALARS_FILE
        _drop_lines_after(self.scalars_path, start)
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(work / TB_DIR), purge_step=start + 1)
        self.text(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} run starts at iteration {start}")

    def text(self, message: str, echo: bool = True) -> None:
        """Append ``message`` to log.txt; with ``echo`` also print it (above the progress bar)."""
        if not self.enabled:
            return
        if echo:
            tqdm.write(message)
        with open(self.log_path, "a", encoding="utf-8") as f:
            f.write(message + "\n")

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """Log ``name -> value`` at ``step`` to TensorBoard and (at the next :meth:`flush`) to scalars.jsonl."""
        if not self.enabled:
            return
        if step != self.step:
            self.flush()
            self.step = step
        for name, value in values.items():
            self.writer.add_scalar(name, value if math.isfinite(value) else 0.0, step)
        self.pending.update(values)

    def images(self, step: int, pictures: dict[str, np.ndarray]) -> None:
        """(H, W, 3) uint8 pictures to TensorBoard."""
        if self.enabled:
            for name, picture in pictures.items():
                self.writer.add_image(name, picture, step, dataformats="HWC")

    def flush(self) -> None:
        """Write the pending step's scalars as one line of scalars.jsonl (NaN as null)."""
        if not self.enabled or not self.pending:
            return
        row = {"step": self.step, **{k: v if math.isfinite(v) else None for k, v in self.pending.items()}}
        with open(self.scalars_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        self.pending = {}

    def close(self) -> None:
        self.flush()
        if self.writer is not None:
            self.writer.close()


def _drop_lines_after(path: Path, step: int) -> None:
    """Keep the lines of ``path`` (a scalars.jsonl) whose step is at most ``step``."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            if json.loads(line)["step"] <= step:
                kept.append(line + "\n")
        except (ValueError, KeyError, TypeError):
            continue
    atomic_write_text(path, "".join(kept))


def train_scalars(losses: dict[str, float], optimizer: torch.optim.Optimizer, seconds: float) -> dict[str, float]:
    """The scalars of one log interval: each loss term (``loss`` as ``loss/total``), each group's learning rate
    (``lr/<group name>``) and the time per step."""
    out = {f"loss/{'total' if k == 'loss' else k}": v for k, v in losses.items()}
    for i, group in enumerate(optimizer.param_groups):
        out[f"lr/{group.get('name', i)}"] = float(group["lr"])  # a device tensor under train.cuda_graphs
    out["time/step_s"] = seconds
    return out


def val_scalars(metrics: dict[str, float], tables: dict[str, SegMetrics]) -> dict[str, float]:
    """The scalars of one validation (:class:`wsss.engine.validate.ValResult`): ``val/<branch>_<aAcc|mIoU|mAcc>``
    and ``val_IoU_<branch>/<class>`` of each segmentation branch; on a val set with tags only, ``val/cls_mAP``,
    ``val/cls_F1`` and each class's AP as ``val_AP/<class>``."""
    out = {f"val/{k}": v for k, v in metrics.items() if k.startswith("cls_")}
    out.update({f"val_AP/{k.removeprefix('AP_')}": v for k, v in metrics.items() if k.startswith("AP_")})
    for branch, result in tables.items():
        out.update({f"val/{branch}_{k}": v for k, v in result.summary.items()})
        ious = zip(result.class_names, result.per_class["IoU"].tolist(), strict=True)
        out.update({f"val_IoU_{branch}/{name}": iou for name, iou in ious})
    return out


def start_summary(
    cfg: Config, device: torch.device, world_size: int, split_sizes: dict[str, int], classes: list[str],
    label_file: Path, model: torch.nn.Module,
) -> str:  # fmt: skip
    """The block printed when training starts: where it runs, on what data, with which model.

    The schedule line gives the global batch, ``train.batch_size`` (per process) x ``world_size``: under
    ``torchrun`` each process draws its own batch, so the global batch grows with the number of GPUs.
    """
    params = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    attention = cfg.model.attention
    blocks = "all blocks" if attention.blocks is None else f"blocks {attention.blocks}"
    weights = f"weights from {cfg.model.load_from}" if cfg.model.load_from else cfg.model.pretrained or "random init"
    lines = [
        f"device      {device}" + (f" x {world_size} processes" if world_size > 1 else ""),
        f"data        {cfg.data.root}: " + ", ".join(f"{n} {split} images" for split, n in split_sizes.items()),
        f"classes     {len(classes)} ({', '.join(classes)})",
        f"labels      {label_file}",
        f"model       {cfg.model.backbone} ({weights}), {attention.name} attention in {blocks}",
        f"parameters  {params / 1e6:.2f} M ({trainable / 1e6:.2f} M trained)",
        f"schedule    {cfg.train.max_iters} iterations, global batch {cfg.train.batch_size * world_size} "
        f"({cfg.train.batch_size} per process x {world_size} process{'es' if world_size > 1 else ''}), "
        f"warm-up {cfg.optim.warmup_iters}",
    ]
    if device.type == "cuda":  # what train.amp, train.cam_dtype and train.fp32_precision make of the step there
        forward, cam = ("bf16 autocast" if bf16 else "float32" for bf16 in (cfg.train.amp,
                                                                            cfg.train.cam_dtype == "bfloat16"))
        lines.append(f"precision   forward pass {forward}, CAM pass {cam}, float32 products "
                     f"{cfg.train.fp32_precision} (docs/reference.md rows 5, 21, 22)")  # fmt: skip
    return "\n".join(lines)


def chance_warning(cls_loss: float, step: int, cfg: Config) -> str | None:
    """A warning when the classification loss is still near chance after the warm-up, else None.

    A classifier that outputs 0.5 for every class has loss ln 2 per class; one that has learned only how often
    each class occurs is already well below it. Checked once, at the first log after ``optim.warmup_iters``.
    """
    chance = math.log(2.0)
    if cls_loss < cfg.train.chance_loss_ratio * chance:
        return None
    return (
        f"warning: after {step} iterations (warm-up {cfg.optim.warmup_iters}) the classification loss is "
        f"{cls_loss:.3f}, at chance level (ln 2 = {chance:.3f}): the model is not learning. Check the image-level "
        f"labels ({cfg.data.label_file}), optim.lr and the data."
    )
