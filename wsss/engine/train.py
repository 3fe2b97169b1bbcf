"""The training loop, top to bottom: data, model, optimiser, then one step at a time.

One step is :class:`wsss.engine.step.TrainingStep` (its module docstring shows the data flow). Single process on
CPU or GPU; ``torchrun`` for several GPUs or nodes (DDP). Checkpoints hold everything a resumed run needs,
every rank's random state included, so N iterations + resume + M iterations give the weights of N + M
uninterrupted ones. Loss terms accumulate on the device and are averaged over ranks at each log interval; a
non-finite loss or gradient skips the update on the device (:mod:`wsss.engine.optim`), and the loop reads that
only where it synchronises anyway (log, validation, checkpoint), then stops before saving.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from tqdm import tqdm

from wsss.config import Config, ModelConfig, dump_config, from_dict
from wsss.data.check import check_dataset
from wsss.data.tags import tag_warnings
from wsss.data.transforms import PixelNormalize, backbone_mean_std
from wsss.data.voc import TaggedValDataset, VOCClsDataset, VOCSegDataset, val_dataset
from wsss.engine.checkpoint import rng_state, save_checkpoint, set_rng_state
from wsss.engine.distributed import EpochItems, ResumableSampler
from wsss.engine.graphs import GraphedIteration
from wsss.engine.logger import RunLogger, chance_warning, start_summary, train_scalars, val_scalars
from wsss.engine.optim import NonFiniteGuard, build_optimizer
from wsss.engine.resume import config_changes, find_checkpoint, restore_training_state
from wsss.engine.retention import CheckpointKeeper
from wsss.engine.schedule import PolyWarmupScheduler
from wsss.engine.step import TERMS, TrainingStep
from wsss.engine.validate import ValResult, best_metric, validate
from wsss.engine.workdir import claim_work_dir, start_afresh
from wsss.evaluation.metrics import format_table
from wsss.model_file import read_model_file
from wsss.models import WSSSModel, build_model
from wsss.models.builder import load_initial_weights
from wsss.utils.distributed import (
    DistInfo,
    all_gather_objects,
    all_reduce_mean,
    barrier,
    collective,
    init_distributed,
)
from wsss.utils.lifetime import die_with_parent
from wsss.utils.tensors import fp32_precision


@dataclass
class TrainResult:
    """What a finished run leaves behind."""

    work_dir: Path
    checkpoint: Path | None
    step: int
    model: WSSSModel
    is_main: bool = True
    """Whether this process is rank 0 (the one that writes files and prints)."""
    val: ValResult | None = None
    history: list[dict[str, float]] = field(default_factory=list)
    """Per log interval: ``step`` and the mean of each loss term over the interval and the ranks."""


class LossMeter:
    """Running sums of the loss terms on the device; :meth:`pop` averages them over steps and ranks with one
    host synchronisation."""

    def __init__(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}
        self.counts: dict[str, int] = {}

    def add(self, terms: dict[str, torch.Tensor]) -> None:
        for k, v in terms.items():
            v = v.detach().float()
            self.sums[k] = self.sums[k] + v if k in self.sums else v
            self.counts[k] = self.counts.get(k, 0) + 1

    def pop(self) -> dict[str, float]:
        """The mean of each term since the last pop, averaged over ranks (every rank must call it together)."""
        keys = sorted(self.sums, key=lambda k: TERMS.index(k) if k in TERMS else len(TERMS))
        if not keys:
            return {}
        means = all_reduce_mean(torch.stack([self.sums[k] / self.counts[k] for k in keys])).tolist()
        self.sums, self.counts = {}, {}
        return dict(zip(keys, means, strict=True))


def batches(loader: DataLoader, sampler: ResumableSampler, start: int) -> Iterator[dict]:
    """Endless batches from iteration ``start`` on; the epoch and offset follow from the iteration."""
    epoch, offset = divmod(start, sampler.num_samples // loader.batch_size)
    while True:
        sampler.set_epoch(epoch, start=offset * loader.batch_size)
        yield from loader
        epoch, offset = epoch + 1, 0


def training_batches(
    train_set: VOCClsDataset, cfg: Config, start: int, device: torch.device, world_size: int, rank: int
) -> Iterator[dict]:
    """This rank's endless training batches from iteration ``start`` on (:func:`batches`); ``cfg.train.batch_size``
    per batch, ``cfg.data.num_workers`` loader workers that die with this process and live across epochs (started
    once: on the toy config's epoch of 50 batches they fed 1.1-1.4x what workers restarted each epoch did,
    docs/benchmarks.md).

    Raises:
        ValueError: This rank's share of the split holds fewer images than one batch (raised at once, before
            any image is read).
    """
    sampler = ResumableSampler(train_set, world_size, rank, seed=cfg.train.seed)
    if sampler.num_samples < cfg.train.batch_size:
        raise ValueError(
            f"the training split has {len(train_set)} images, fewer than one batch of {cfg.train.batch_size} per "
            "process; lower train.batch_size"
        )
    loader = DataLoader(
        EpochItems(train_set),
        batch_size=cfg.train.batch_size,
        sampler=sampler,
        num_workers=cfg.data.num_workers,
        drop_last=True,
        pin_memory=device.type == "cuda",
        generator=torch.Generator().manual_seed(cfg.train.seed),  # keeps the global RNG stream untouched
        worker_init_fn=functools.partial(die_with_parent, os.getpid()),
        persistent_workers=cfg.data.num_workers > 0,
    )
    return batches(loader, sampler, start)


def to_device(batch: dict, device: torch.device, normalize: PixelNormalize | None = None) -> dict:
    """The batch's tensors on ``device``, its uint8 ``image`` made the model's input there by ``normalize`` (the
    loader's batches, :meth:`VOCClsDataset.normalize`; None: ``image`` is that already), and ``max_present``: the
    largest number of classes in one image, counted on the host so that the pseudo labels need not ask the device."""
    moved = {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}
    if normalize is not None:
        moved["image"] = normalize(moved["image"])
    return {**moved, "max_present": int(batch["label"].numpy().sum(axis=1).max())}


def iteration(
    model: torch.nn.Module,
    raw_model: WSSSModel,
    step: TrainingStep,
    batch: dict,
    it: int,
    optimizer: torch.optim.Optimizer,
    scheduler: PolyWarmupScheduler,
    guard: NonFiniteGuard,
    meter: LossMeter,
) -> None:
    """Iteration ``it`` on a batch already on the device: loss, backward, the non-finite guard, the update (skipped
    on the device if the guard tripped), the schedule, the loss meter. Nothing here waits for the device."""
    loss, terms = step(model, raw_model, batch, it)
    optimizer.zero_grad(set_to_none=True)
    with collective("the gradients' all-reduce"):  # DDP's, in the backward pass
        loss.backward()
    guard.update(loss, it)
    optimizer.step()
    scheduler.step()
    meter.add({**terms, "loss": loss})


def train(
    cfg: Config,
    work_dir: str | Path | None = None,
    resume: str | bool | None = None,
    device: str | None = None,
    overwrite: bool = False,
) -> TrainResult:
    """Train the model ``cfg`` describes, a GPU's float32 products as ``train.fp32_precision`` says (the earlier
    setting restored on return).

    Args:
        cfg: The resolved config.
        work_dir: Where checkpoints, the resolved config, logs and TensorBoard events go (default:
            ``cfg.work_dir``, else ``work_dirs/run``).
        resume: A checkpoint path, or True for the work dir's newest valid checkpoint (a fresh start if none).
        device: ``cuda`` or ``cpu`` (default: CUDA when available).
        overwrite: Start from scratch even if the work dir holds checkpoints (they are deleted, once the data, the
            model and the optimiser are ready; :func:`wsss.engine.workdir.start_afresh`).

    Raises:
        WorkDirError: Another run holds the work dir, or it holds checkpoints and neither ``resume`` nor
            ``overwrite`` is given (:mod:`wsss.engine.workdir`).
        wsss.engine.optim.NonFiniteLossError: A loss or gradient became NaN/inf; the updates from then on were
            skipped, and the last good checkpoint is left as it was.
    """
    work = Path(work_dir or cfg.work_dir or "work_dirs/run")
    with fp32_precision(cfg.train.fp32_precision):
        if int(os.environ.get("RANK", "0")) != 0:  # rank 0 alone writes the work dir
            return _train(cfg, work, resume, device, overwrite)
        with claim_work_dir(work, resume, overwrite):
            return _train(cfg, work, resume, device, overwrite)


def _train(cfg: Config, work: Path, resume: str | bool | None, device: str | None, overwrite: bool) -> TrainResult:
    dist_info = init_distributed(device)
    cfg = dataclasses.replace(cfg, work_dir=str(work))
    torch.manual_seed(cfg.train.seed + dist_info.rank)
    np.random.seed(cfg.train.seed + dist_info.rank)

    if cfg.data.check_images and (problems := check_dataset(cfg.data, progress=dist_info.is_main)):
        listed = "; ".join(f"{p.path}: {p.reason}" for p in problems[:3])
        raise ValueError(f"data.check_images: {len(problems)} problem(s) ({listed}); tools/check_dataset.py lists all")
    mean, std = backbone_mean_std(cfg.model.backbone)
    train_set = VOCClsDataset(cfg.data, mean, std, seed=cfg.train.seed)
    val_set = val_dataset(cfg.data, mean, std)
    classes = train_set.classes
    found = find_checkpoint(work, resume)  # on the CPU: load_state_dict copies onto the model's device
    # a resumed run takes every weight from its checkpoint, and a new run with model.load_from every backbone weight
    # from that file: neither fetches model.pretrained (no hub access)
    load_from = cfg.model.load_from if found is None else ""
    model_cfg = cfg.model if found is None and not load_from else dataclasses.replace(cfg.model, pretrained="")
    raw_model = build_model(model_cfg, num_classes=len(classes)).to(dist_info.device)
    loaded = _start_from(raw_model, load_from, cfg.model, classes) if load_from else None
    optim = cfg.optim
    optimizer = build_optimizer(raw_model, optim)
    scheduler = PolyWarmupScheduler(optimizer, cfg.train.max_iters, optim.warmup_iters, optim.warmup_ratio, optim.power)

    start, ckpt_path, changes = 0, None, []
    if found is not None:  # weights and moments from the checkpoint, the schedule from cfg (wsss/engine/resume.py)
        ckpt_path, ckpt = found
        start = restore_training_state(ckpt, ckpt_path, raw_model, optimizer, scheduler, classes)
        _restore_rng(ckpt["rng"], dist_info, cfg.train.seed + start)
        changes = config_changes(ckpt["config"], cfg)
    data = training_batches(train_set, cfg, start, dist_info.device, dist_info.world_size, dist_info.rank)
    normalize = train_set.normalize(dist_info.device)
    # everything that can fail before the first step has run: only now is the earlier run cleared
    cleared = start_afresh(work, overwrite) if dist_info.is_main and not resume else []
    if dist_info.is_main:
        work.mkdir(parents=True, exist_ok=True)
        dump_config(cfg, work / "config.py")
    log = RunLogger(work, start, enabled=dist_info.is_main)
    for note in cleared:
        log.text(note)
    sizes = {cfg.data.train_split: len(train_set), cfg.data.val_split: len(val_set)}
    log.text(start_summary(cfg, dist_info.device, dist_info.world_size, sizes, classes, train_set.label_path,
                           raw_model))  # fmt: skip
    if train_set.tags is not None:
        for warning in tag_warnings(train_set.tags, classes, cfg.data.min_class_images, train_set.label_path):
            log.text(warning)
    if loaded is not None:
        log.text(loaded)
    if ckpt_path is not None:
        log.text(f"resuming from {ckpt_path} at iteration {start}")
        if cfg.model.load_from:
            log.text(
                f"model.load_from ({cfg.model.load_from}) is ignored: resuming, and {ckpt_path} holds every weight"
            )
    if changes:
        log.text(f"the config changed since that checkpoint ({'; '.join(changes)}); the new values apply, the "
                 f"learning rate follows the new schedule from iteration {start}")  # fmt: skip
    keeper = CheckpointKeeper(work, cfg.train.max_keep_ckpts, start, best_metric(val_set), writes=dist_info.is_main)
    model = _wrap(raw_model, dist_info)
    if cfg.train.compile:
        model = torch.compile(model)

    step = TrainingStep(cfg, mean, std, dist_info.device)
    guard = NonFiniteGuard(optimizer)
    meter = LossMeter()
    run_iteration = iteration_runner(
        cfg, dist_info.device, dist_info.enabled, model, raw_model, step, optimizer, scheduler, guard, meter
    )
    result = TrainResult(work_dir=work, checkpoint=ckpt_path, step=start, model=raw_model, is_main=dist_info.is_main)
    model.train()
    bar = tqdm(
        total=cfg.train.max_iters, initial=start, desc="train", unit="it", dynamic_ncols=True,
        disable=not dist_info.is_main,
    )  # fmt: skip

    def save(step: int) -> Path:
        """Checkpoint iteration ``step``: rank 0 writes it, with every rank's random state (all ranks call this)."""
        rng = all_gather_objects(rng_state())
        path = work / f"iter_{step}.pth"
        if dist_info.is_main:
            save_checkpoint(path, raw_model, cfg, classes, mean, std, step, optimizer, scheduler, rng)
        return path

    tic, last_log, skipped = time.perf_counter(), start, []
    intervals = (cfg.train.log_interval, cfg.train.val_interval, cfg.train.ckpt_interval)
    for it in range(start, cfg.train.max_iters):
        batch = to_device(next(data), dist_info.device, normalize)
        skipped += [line for line in batch["skipped"] if line]  # unreadable images the loader passed over
        run_iteration(batch, it)
        done = it + 1
        result.step = done
        bar.update(1)
        log_now, val_now, save_now = (done % interval == 0 or done == cfg.train.max_iters for interval in intervals)
        if log_now or val_now or save_now:  # the device is read here, never between
            guard.raise_if_tripped(result.checkpoint)
        if log_now:
            for line in (line for part in all_gather_objects(skipped) for line in part):
                log.text(line, echo=False)  # the loader already printed it
            skipped = []
            logged = meter.pop()
            seconds = (time.perf_counter() - tic) / (done - last_log)
            tic, last_log = time.perf_counter(), done
            bar.set_postfix({k: f"{v:.3f}" for k, v in logged.items()}, refresh=False)
            scalars = train_scalars(logged, optimizer, seconds)
            log.scalars(done, scalars)
            log.text(f"iter {done}/{cfg.train.max_iters}  " + "  ".join(f"{k} {v:.4g}" for k, v in scalars.items()),
                     echo=False)  # fmt: skip
            if "cls" in logged and done - cfg.train.log_interval < cfg.optim.warmup_iters <= done:
                warning = chance_warning(logged["cls"], done, cfg)
                if warning:
                    log.text(warning)
            result.history.append({"step": done, **logged})
        saved = save_now
        if save_now:  # before validating: a validation that fails never costs the iterations before it
            result.checkpoint = save(done)
        if val_now:
            result.val = _validate(raw_model, val_set, cfg, dist_info, log, done)
            if keeper.is_best(result.val.metrics):
                if not saved:
                    result.checkpoint, saved = save(done), True
                keeper.mark_best(done, result.checkpoint, result.val.metrics)
        if saved:
            keeper.prune()
            barrier()
        log.flush()
    bar.close()
    log.close()
    return result


def iteration_runner(
    cfg: Config,
    device: torch.device,
    distributed: bool,
    model: torch.nn.Module,
    raw_model: WSSSModel,
    step: TrainingStep,
    optimizer: torch.optim.Optimizer,
    scheduler: PolyWarmupScheduler,
    guard: NonFiniteGuard,
    meter: LossMeter,
) -> Callable[[dict, int], None]:
    """``run(batch, it)``: one iteration, as replayed CUDA graphs on a single GPU with ``train.cuda_graphs`` (and
    neither DDP, ``distributed``, nor ``train.compile``), else :func:`iteration`."""
    if cfg.train.cuda_graphs and device.type == "cuda" and not distributed and not cfg.train.compile:
        graphed = GraphedIteration(raw_model, step, optimizer, scheduler, guard, cfg.train.cuda_graph_warmup)

        def run(batch: dict, it: int) -> None:
            loss, terms = graphed(batch, it)
            meter.add({**terms, "loss": loss})

        return run
    return functools.partial(iteration, model, raw_model, step, optimizer=optimizer, scheduler=scheduler, guard=guard,
                             meter=meter)  # fmt: skip


def _start_from(model: WSSSModel, path: str, model_cfg: ModelConfig, classes: list[str]) -> str:
    """Start a new run's ``model`` from the weights of a wsss checkpoint or export (``model.load_from``), not its
    optimiser, schedule or iteration: every weight with the same ``classes`` (names, in order), else all but the
    class heads, which keep their fresh initialisation (:func:`wsss.models.builder.load_initial_weights`).

    Returns:
        The line the run logs: the file, and which heads were re-initialised.

    Raises:
        FileNotFoundError: The file is missing.
        ValueError: The file is neither a wsss checkpoint nor an export, or holds another architecture; one line
            naming the file and what differs.
    """
    try:
        ckpt = read_model_file(path)
    except (FileNotFoundError, ValueError) as err:
        raise type(err)(f"model.load_from: {err}") from None
    same = list(ckpt["classes"]) == list(classes)
    try:
        fresh = load_initial_weights(model, ckpt["model"], same)
    except ValueError as err:
        differ = _architecture_changes(from_dict(ModelConfig, ckpt["config"]["model"], "model"), model_cfg)
        raise ValueError(
            f"model.load_from={path}: its model differs from the configured one ({'; '.join(differ or [str(err)])}); "
            "configure model.backbone and model.backbone_kwargs as in its config, or give backbone weights to "
            "model.pretrained instead"
        ) from None
    if same:
        return (
            f"model.load_from: weights from {path} (iteration {ckpt.get('step')} of its run), every weight kept; the "
            "optimiser, the schedule and the iteration start afresh"
        )
    return (
        f"model.load_from: weights from {path}, trained on {len(ckpt['classes'])} classes {list(ckpt['classes'])}, "
        f"this run has {len(classes)} {list(classes)}: re-initialised {', '.join(fresh)} (the class heads), the rest "
        "loaded; the optimiser, the schedule and the iteration start afresh"
    )


def _architecture_changes(saved: ModelConfig, current: ModelConfig) -> list[str]:
    """``model.<key>: <saved> in the file, <current> here`` for each value that shapes the weights and differs."""
    kwargs = sorted(saved.backbone_kwargs.keys() | current.backbone_kwargs.keys())
    pairs = [
        ("backbone", saved.backbone, current.backbone),
        *((f"backbone_kwargs.{k}", saved.backbone_kwargs.get(k), current.backbone_kwargs.get(k)) for k in kwargs),
        ("attention.name", saved.attention.name, current.attention.name),
        ("decoder_channels", saved.decoder_channels, current.decoder_channels),
    ]
    return [f"model.{key}: {a!r} in the file, {b!r} here" for key, a, b in pairs if a != b]


def _restore_rng(states: list | dict, info: DistInfo, fallback_seed: int) -> None:
    """Give each rank back its own random state; a checkpoint of another world size cannot resume exactly."""
    states = states if isinstance(states, list) else [states]
    if len(states) == info.world_size:
        set_rng_state(states[info.rank])
        return
    torch.manual_seed(fallback_seed + info.rank)
    if info.is_main:
        print(
            f"warning: the checkpoint holds the random state of {len(states)} process(es), this run has "
            f"{info.world_size}: training continues, but not bit-identically to an uninterrupted run"
        )


def _wrap(raw_model: WSSSModel, info: DistInfo) -> torch.nn.Module:
    if not info.enabled:
        return raw_model
    ids = [info.device.index] if info.device.type == "cuda" else None
    return DistributedDataParallel(raw_model, device_ids=ids)


def _validate(
    raw_model: WSSSModel,
    val_set: VOCSegDataset | TaggedValDataset,
    cfg: Config,
    info: DistInfo,
    log: RunLogger,
    step: int,
) -> ValResult:
    res = validate(raw_model, val_set, cfg, info.device, cfg.train.val_max_images)
    for reason in res.skipped:
        log.text(f"warning: skipping val image {reason}")
    log.text(f"[iter {step}] val: " + "  ".join(f"{k} {v:.2f}" for k, v in res.metrics.items()))
    log.scalars(step, val_scalars(res.metrics, res.tables))
    log.images(step, {f"val/{name}": picture for name, picture in res.pictures.items()})
    if "seg" in res.tables:
        log.text(f"segmentation, iter {step}:\n{format_table(res.tables['seg'])}")
    for note in res.notes:
        log.text(f"note: {note}")
    return res
