"""The training loop, top to bottom: data, model, optimiser, then one step at a time.

One step (DESIGN.md section 1)::

    crops -> model -> L_cls (final) + aux_weight * L_cls (aux)
    from seg_start_iter on, also:
    crops -> no-grad multi-scale CAM -> dual-threshold PAR pseudo labels
          -> seg_weight * L_seg (balanced CE) + reg_weight * L_reg (dense energy on the seg softmax)

Single process on CPU or GPU; ``torchrun`` for several GPUs or nodes (DDP). Checkpoints hold everything a
resumed run needs, so N iterations + resume + M iterations give the weights of N + M uninterrupted ones.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from tqdm import tqdm

from wsss.cam import multiscale_cam
from wsss.checkpoint import find_resume_checkpoint, load_checkpoint, save_checkpoint, set_rng_state
from wsss.config import Config, dump_config
from wsss.data.transforms import backbone_mean_std, denormalize
from wsss.data.voc import VOCClsDataset, VOCSegDataset
from wsss.distributed import DistInfo, ResumableSampler, all_reduce_mean, barrier, init_distributed
from wsss.evaluation import format_table
from wsss.losses import DenseEnergyLoss, balanced_seg_ce, multilabel_soft_margin
from wsss.models import WSSSModel, build_model
from wsss.par import PAR
from wsss.pseudo_label import boxes_to_mask, pseudo_labels
from wsss.schedule import PolyWarmupScheduler
from wsss.validate import ValResult, validate


class NonFiniteLossError(FloatingPointError):
    """A loss became NaN or infinite; training stopped before the weights were touched."""


@dataclass
class TrainResult:
    """What a finished run leaves behind."""

    work_dir: Path
    checkpoint: Path | None
    step: int
    model: WSSSModel
    val: ValResult | None = None
    history: list[dict[str, float]] = field(default_factory=list)


class Step:
    """Everything one training step needs besides the batch: losses, PAR, constants from the config."""

    def __init__(self, cfg: Config, mean: tuple[float, ...], std: tuple[float, ...], device: torch.device):
        self.cfg = cfg
        self.mean, self.std = mean, std
        self.par = PAR.from_config(cfg.par).to(device)
        self.energy = DenseEnergyLoss(
            weight=cfg.loss.reg_energy_weight,
            sigma_rgb=cfg.loss.reg_sigma_rgb,
            sigma_xy=cfg.loss.reg_sigma_xy,
            scale_factor=cfg.loss.reg_scale,
            ignore_index=cfg.data.ignore_index,
        )
        self.amp = cfg.train.amp and device.type == "cuda"

    def __call__(
        self, model: torch.nn.Module, bare: WSSSModel, batch: dict, it: int
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Total loss of ``batch`` at iteration ``it`` and its parts (floats, for logging)."""
        cfg = self.cfg
        images, labels, boxes = batch["image"], batch["label"], batch["box"]
        with torch.autocast(images.device.type, dtype=torch.bfloat16, enabled=self.amp):
            out = model(images)
        loss_cls = multilabel_soft_margin(out.logits.float(), labels)
        loss_aux = multilabel_soft_margin(out.aux_logits.float(), labels)
        loss = loss_cls + cfg.loss.aux_weight * loss_aux
        parts = {"cls": loss_cls.item(), "aux": loss_aux.item()}
        if it < cfg.loss.seg_start_iter or cfg.loss.seg_weight == cfg.loss.reg_weight == 0:
            # Keep the decoder in the graph so DDP sees a gradient (zero) for every parameter.
            return loss + 0.0 * out.seg.float().sum(), parts

        h, w = images.shape[-2:]
        with torch.autocast(images.device.type, dtype=torch.bfloat16, enabled=self.amp):
            cams = multiscale_cam(bare.cam, images, labels, cfg.cam.scales)
        rgb01 = denormalize(images.float(), self.mean, self.std)
        valid = boxes_to_mask(boxes, h, w)
        target = pseudo_labels(
            rgb01, cams, labels, valid, self.par, cfg.cam.fg_thresh, cfg.cam.bg_thresh,
            cfg.par.scale, cfg.data.ignore_index,
        )  # fmt: skip
        seg = F.interpolate(out.seg.float(), size=(h, w), mode="bilinear", align_corners=False)
        loss_seg = balanced_seg_ce(seg, target, cfg.data.ignore_index)
        loss = loss + cfg.loss.seg_weight * loss_seg
        parts["seg"] = loss_seg.item()
        if cfg.loss.reg_weight > 0:
            loss_reg = self.energy(rgb01 * 255.0, seg.softmax(dim=1), valid, target)
            loss = loss + cfg.loss.reg_weight * loss_reg
            parts["reg"] = loss_reg.item()
        return loss, parts


def batches(
    loader: DataLoader, sampler: ResumableSampler, dataset: VOCClsDataset, start: int
) -> Iterator[dict]:
    """Endless batches from iteration ``start`` on; the epoch and offset follow from the iteration."""
    per_epoch = sampler.num_samples // loader.batch_size
    if per_epoch == 0:
        raise ValueError(
            f"the training split has {len(dataset)} images, fewer than one batch of {loader.batch_size} per "
            "process; lower train.batch_size"
        )
    epoch, offset = divmod(start, per_epoch)
    while True:
        dataset.epoch = epoch
        sampler.set_epoch(epoch, start=offset * loader.batch_size)
        yield from loader
        epoch, offset = epoch + 1, 0


def to_device(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}


def train(
    cfg: Config, work_dir: str | Path | None = None, resume: str | bool | None = None, device: str | None = None
) -> TrainResult:
    """Train the model ``cfg`` describes.

    Args:
        cfg: The resolved config.
        work_dir: Where checkpoints, the resolved config, logs and TensorBoard events go (default:
            ``cfg.work_dir``, else ``work_dirs/run``).
        resume: A checkpoint path, or True for the work dir's newest checkpoint (a fresh start if none).
        device: ``cuda`` or ``cpu`` (default: CUDA when available).

    Raises:
        NonFiniteLossError: A loss became NaN/inf; the last good checkpoint is left as it was.
    """
    dist_info = init_distributed(device)
    work = Path(work_dir or cfg.work_dir or "work_dirs/run")
    cfg = dataclasses.replace(cfg, work_dir=str(work))
    torch.manual_seed(cfg.train.seed + dist_info.rank)
    np.random.seed(cfg.train.seed + dist_info.rank)

    mean, std = backbone_mean_std(cfg.model.backbone)
    train_set = VOCClsDataset(cfg.data, mean, std, seed=cfg.train.seed)
    val_set = VOCSegDataset(cfg.data, mean, std)
    classes = train_set.classes
    bare = build_model(cfg.model, num_classes=len(classes)).to(dist_info.device)
    optimizer = torch.optim.AdamW(
        bare.param_groups(cfg.optim.lr, cfg.optim.head_lr_mult, cfg.optim.weight_decay), betas=cfg.optim.betas
    )
    scheduler = PolyWarmupScheduler(
        optimizer, cfg.train.max_iters, cfg.optim.warmup_iters, cfg.optim.warmup_ratio, cfg.optim.power
    )

    start = 0
    ckpt_path = find_resume_checkpoint(work) if resume is True else (Path(resume) if resume else None)
    if ckpt_path is not None:
        ckpt = load_checkpoint(ckpt_path, map_location=dist_info.device)
        bare.load_state_dict(ckpt["model"], strict=True)
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        start = int(ckpt["step"])
        set_rng_state(ckpt["rng"])
        if dist_info.rank > 0:  # each rank continues its own stream, as in an uninterrupted run
            torch.manual_seed(cfg.train.seed + dist_info.rank + start)
    if dist_info.is_main:
        work.mkdir(parents=True, exist_ok=True)
        dump_config(cfg, work / "config.py")
        if ckpt_path is not None:
            print(f"resuming from {ckpt_path} at iteration {start}")
    model = _wrap(bare, dist_info)

    sampler = ResumableSampler(train_set, dist_info.world_size, dist_info.rank, seed=cfg.train.seed)
    loader = DataLoader(
        train_set,
        batch_size=cfg.train.batch_size,
        sampler=sampler,
        num_workers=cfg.data.num_workers,
        drop_last=True,
        pin_memory=dist_info.device.type == "cuda",
        generator=torch.Generator().manual_seed(cfg.train.seed),  # keeps the global RNG stream untouched
    )
    step = Step(cfg, mean, std, dist_info.device)
    writer = _writer(work) if dist_info.is_main else None
    result = TrainResult(work_dir=work, checkpoint=ckpt_path, step=start, model=bare)
    model.train()
    data = batches(loader, sampler, train_set, start)
    bar = tqdm(
        total=cfg.train.max_iters, initial=start, desc="train", unit="it", dynamic_ncols=True,
        disable=not dist_info.is_main,
    )  # fmt: skip
    for it in range(start, cfg.train.max_iters):
        tic = time.perf_counter()
        batch = to_device(next(data), dist_info.device)
        loss, parts = step(model, bare, batch, it)
        finite = all_reduce_mean(torch.isfinite(loss.detach()).float())
        if finite.item() < 1.0:
            raise NonFiniteLossError(
                f"non-finite loss at iteration {it} ({', '.join(f'{k}={v:.4g}' for k, v in parts.items())}); "
                f"stopped before updating the weights. Last good checkpoint: "
                f"{result.checkpoint or 'none yet'}. Lower optim.lr or check the data."
            )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
        done = it + 1
        result.step = done
        parts["loss"] = loss.item()
        bar.update(1)
        bar.set_postfix({k: f"{v:.3f}" for k, v in parts.items()}, refresh=False)
        if writer is not None and (done % cfg.train.log_interval == 0 or done == cfg.train.max_iters):
            for k, v in parts.items():
                writer.add_scalar(f"loss/{k}", v, done)
            writer.add_scalar("lr/backbone", optimizer.param_groups[0]["lr"], done)
            writer.add_scalar("time/step_s", time.perf_counter() - tic, done)
            result.history.append({"step": done, **parts})
        if done % cfg.train.val_interval == 0 or done == cfg.train.max_iters:
            result.val = _validate(bare, val_set, cfg, dist_info, writer, done)
        if done % cfg.train.ckpt_interval == 0 or done == cfg.train.max_iters:
            if dist_info.is_main:
                result.checkpoint = work / f"iter_{done}.pth"
                save_checkpoint(result.checkpoint, bare, cfg, classes, mean, std, done, optimizer, scheduler)
            barrier()
    bar.close()
    if writer is not None:
        writer.close()
    return result


def _wrap(bare: WSSSModel, info: DistInfo) -> torch.nn.Module:
    if not info.enabled:
        return bare
    ids = [info.device.index] if info.device.type == "cuda" else None
    return DistributedDataParallel(bare, device_ids=ids)


def _writer(work: Path):
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(str(work / "tb"))


def _validate(
    bare: WSSSModel, val_set: VOCSegDataset, cfg: Config, info: DistInfo, writer, step: int
) -> ValResult:
    res = validate(bare, val_set, cfg, info.device, cfg.train.val_max_images)
    if info.is_main:
        summary = "  ".join(f"{k} {v:.2f}" for k, v in res.metrics.items())
        tqdm.write(f"[iter {step}] val: {summary}")
        if writer is not None:
            for k, v in res.metrics.items():
                writer.add_scalar(f"val/{k}", v if not math.isnan(v) else 0.0, step)
            for name, picture in res.pictures.items():
                writer.add_image(f"val/{name}", picture, step, dataformats="HWC")
        tqdm.write(f"segmentation, iter {step}:\n{format_table(res.tables['seg'])}")
    return res
