"""Classification pre-training of the backbone, for datasets that no public checkpoint knows (the toy sets).

The backbone of ``cfg.model`` (:func:`wsss.models.build_model_backbone`) with a linear head on timm's pooling
(``model.backbone_kwargs.global_pool``: the class token by default, ``"max"`` or ``"avg"`` over the patch
tokens; with ``fc_norm=False`` the saved keys stay those of the default model) is trained as a multi-label
classifier on the image-level labels of a VOC-layout set, as ImageNet pre-training trains a single-label one;
with ``pretrain.labels = "crop"`` (a generated set, whose masks are exact) each crop's targets are the classes
its mask shows (:func:`crop_labels`) instead of the whole image's.
Its timm state_dict (the head left out) is then saved for ``model.pretrained``, which loads it strictly like
any pretrained backbone::

    pretrain(cfg, work_dir) -> work_dir/backbone.pth  {"state_dict": timm keys -> tensors, "config", "classes", ...}
    WSSS config: model.pretrained = "work_dir/backbone.pth"  (wsss.models.backbone.load_timm_checkpoint)

Every value comes from the config of WSSS training (:mod:`wsss.config`): ``model`` (backbone, kwargs,
attention variant, ``freeze_pos_embed``, drop-path), ``data`` (root, splits, labels, augmentation, crop),
``optim`` (``lr`` and ``weight_decay`` for every parameter, warm-up and poly decay as
:mod:`wsss.engine.schedule`), ``train`` (iterations, batch, seed, log / val / checkpoint intervals) and
``infer.cls_thresh`` (the F1 threshold). The loss is the multi-label soft margin of the WSSS classifiers; the
optimiser is the fused AdamW of WSSS training with its device-side guard against non-finite steps.

Interrupted, a pre-training resumes: every ``train.ckpt_interval`` iterations the classifier, the optimiser,
the schedule and the random state are written atomically to ``work_dir/pretrain_state.pth``, and the next call
with the same work dir continues from it (the crops are a function of the seed, epoch and index, so the run
ends as an uninterrupted one would). ``backbone.pth`` is written once, atomically, at the end.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from wsss.cam import labels_from_mask
from wsss.config import Config, dump_config, to_dict
from wsss.data.transforms import backbone_mean_std
from wsss.data.voc import VOCClsDataset, VOCSegDataset
from wsss.engine.checkpoint import rng_state, set_rng_state
from wsss.engine.optim import NonFiniteGuard
from wsss.engine.schedule import PolyWarmupScheduler
from wsss.engine.train import training_batches
from wsss.evaluation.classification import multilabel_scores
from wsss.losses import multilabel_soft_margin
from wsss.models import build_model_backbone
from wsss.utils.fileio import atomic_torch_save

__all__ = [
    "BACKBONE_FILE",
    "STATE_FILE",
    "ImageClassifier",
    "PretrainResult",
    "crop_labels",
    "evaluate_classifier",
    "pretrain",
]

BACKBONE_FILE = "backbone.pth"
"""Name of the saved backbone in the work dir."""
STATE_FILE = "pretrain_state.pth"
"""Name of the resumable training state in the work dir."""


def crop_labels(mask: torch.Tensor, num_classes: int, min_fraction: float) -> torch.Tensor:
    """(B, H, W) class indices (255 ignored) -> (B, C-1) float multi-hot of the foreground classes that are in
    the crop and cover at least ``min_fraction`` of its H x W pixels (``pretrain.labels = "crop"``)."""
    b = mask.shape[0]
    flat = mask.reshape(b, -1)
    valid = flat < num_classes
    index = flat + torch.arange(b, device=mask.device)[:, None] * num_classes  # (image, class) -> one bin
    counts = torch.bincount(index[valid], minlength=b * num_classes).view(b, num_classes)
    fg = counts[:, 1:]
    return ((fg > 0) & (fg >= min_fraction * flat.shape[1])).float()


class ImageClassifier(nn.Module):
    """A backbone and a linear multi-label head on timm's pooling: images (B, 3, H, W) -> logits (B, K)."""

    def __init__(self, cfg: Config, num_fg_classes: int):
        super().__init__()
        self.backbone = build_model_backbone(cfg.model)
        self.head = nn.Linear(self.backbone.embed_dim, num_fg_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        try:
            pooled = self.backbone.vit(x)  # (B, D): timm's pooling after the final norm (its own head is Identity)
        finally:
            if self.backbone.first_values is not None:
                self.backbone.first_values.clear()
        return self.head(pooled)


@dataclass
class PretrainResult:
    """What a finished pre-training leaves behind."""

    checkpoint: Path
    """The saved backbone (``{"state_dict": ..., ...}``, see :func:`pretrain`)."""
    step: int
    metrics: dict[str, float]
    """Validation ``cls_mAP``, ``cls_F1`` and each class's ``AP_<name>`` (percent) at the last step."""
    seconds: float
    """Wall time of this call's training loop and validations."""
    history: list[dict[str, float]] = field(default_factory=list)
    """Per log interval of this call: ``step`` and the mean ``loss`` over the interval."""


@torch.no_grad()
def evaluate_classifier(
    model: ImageClassifier, dataset: VOCSegDataset, device: torch.device, threshold: float
) -> dict[str, float]:
    """Multi-label scores (:func:`wsss.evaluation.classification.multilabel_scores`: mAP, F1 and each class's
    AP) of ``model`` on the whole images of ``dataset``, labels from the masks."""
    was_training = model.training
    model.eval()
    num_classes = len(dataset.classes)
    probs, targets = [], []
    for i in tqdm(range(len(dataset)), desc="val", unit="img", leave=False, dynamic_ncols=True):
        item = dataset[i]
        probs.append(model(item["image"][None].to(device)).float().sigmoid()[0].cpu())
        targets.append(labels_from_mask(item["mask"], num_classes))
    model.train(was_training)
    probs, targets = torch.stack(probs).numpy(), torch.stack(targets).numpy()
    return multilabel_scores(probs, targets, threshold, names=dataset.classes[1:])


def pretrain(cfg: Config, work_dir: str | Path, device: torch.device) -> PretrainResult:
    """Train the classifier ``cfg`` describes and save its backbone to ``work_dir/backbone.pth``.

    The file holds ``{"state_dict": the timm state_dict of the backbone, "config": the resolved config,
    "classes": names with background first, "step", "metrics"}``, readable with
    ``torch.load(weights_only=True)``. A ``work_dir/pretrain_state.pth`` left by an interrupted call is
    resumed (module docstring).

    Raises:
        ValueError: The training split holds fewer images than one batch.
        wsss.engine.optim.NonFiniteLossError: A loss or gradient became non-finite (nothing more is saved).
    """
    work = Path(work_dir)
    torch.manual_seed(cfg.train.seed)
    np.random.seed(cfg.train.seed)
    mean, std = backbone_mean_std(cfg.model.backbone)
    by_crop = cfg.pretrain.labels == "crop"
    train_set = VOCClsDataset(cfg.data, mean, std, seed=cfg.train.seed, with_mask=by_crop)
    val_set = VOCSegDataset(cfg.data, mean, std)
    model = ImageClassifier(cfg, len(train_set.classes) - 1).to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    optim = cfg.optim
    optimizer = torch.optim.AdamW(params, lr=optim.lr, betas=optim.betas, weight_decay=optim.weight_decay, fused=True)
    scheduler = PolyWarmupScheduler(optimizer, cfg.train.max_iters, optim.warmup_iters, optim.warmup_ratio, optim.power)
    guard = NonFiniteGuard(optimizer)
    start, last_saved = 0, None
    if (work / STATE_FILE).is_file():
        state = torch.load(work / STATE_FILE, map_location=device, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        set_rng_state(state["rng"])
        start, last_saved = state["step"], work / STATE_FILE
        print(f"resuming pre-training from {work / STATE_FILE} at iteration {start}")
    work.mkdir(parents=True, exist_ok=True)
    dump_config(cfg, work / "config.py")

    data = training_batches(train_set, cfg, start, device, 1, 0)
    normalize = train_set.normalize(device)
    result = PretrainResult(checkpoint=work / BACKBONE_FILE, step=start, metrics={}, seconds=0.0)
    running = torch.zeros((), device=device)
    tic = time.perf_counter()
    model.train()
    bar = tqdm(total=cfg.train.max_iters, initial=start, desc="pretrain", unit="it", dynamic_ncols=True)
    for it in range(start, cfg.train.max_iters):
        batch = next(data)
        if by_crop:
            target = crop_labels(batch["mask"], len(train_set.classes), cfg.pretrain.crop_label_min_fraction)
        else:
            target = batch["label"]
        loss = multilabel_soft_margin(model(normalize(batch["image"].to(device))).float(), target.to(device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        guard.update(loss, it)
        optimizer.step()
        scheduler.step()
        running += loss.detach()
        done = result.step = it + 1
        bar.update(1)
        log_now, val_now, save_now = (
            done % interval == 0 or done == cfg.train.max_iters
            for interval in (cfg.train.log_interval, cfg.train.val_interval, cfg.train.ckpt_interval)
        )
        if log_now or val_now or save_now:
            guard.raise_if_tripped(last_saved)
        if log_now:
            steps = done - (result.history[-1]["step"] if result.history else start)
            result.history.append({"step": done, "loss": running.item() / steps})
            bar.set_postfix(loss=f"{result.history[-1]['loss']:.3f}", refresh=False)
            running.zero_()
        if val_now:
            result.metrics = evaluate_classifier(model, val_set, device, cfg.infer.cls_thresh)
            tqdm.write(f"[iter {done}] val: " + "  ".join(f"{k} {v:.2f}" for k, v in result.metrics.items()))
        if save_now and done < cfg.train.max_iters:
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                     "scheduler": scheduler.state_dict(), "rng": rng_state(), "step": done}  # fmt: skip
            last_saved = work / STATE_FILE
            atomic_torch_save(state, last_saved)
    bar.close()
    result.seconds = time.perf_counter() - tic
    backbone = {k: v.detach().cpu().contiguous() for k, v in model.backbone.vit.state_dict().items()}
    atomic_torch_save(
        {"state_dict": backbone, "config": to_dict(cfg), "classes": list(train_set.classes), "step": result.step,
         "metrics": result.metrics},
        result.checkpoint,
    )  # fmt: skip
    (work / STATE_FILE).unlink(missing_ok=True)
    return result
