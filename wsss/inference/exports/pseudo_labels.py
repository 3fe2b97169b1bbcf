"""Pseudo-label export for a second stage (``tools/make_pseudo_labels.py``): the masks the training recipe makes,
for every image of a split at full resolution, in VOC layout, sharded under ``torchrun``.

For each image, with its image-level labels from the training label file (``data.label_file``, as in the WSSS
literature; never from masks), the model of the checkpoint (eval mode) gives multi-scale flipped CAMs
(:func:`wsss.cam.multiscale_cam` at ``cam.scales``), and one PAR pass (:func:`wsss.pseudo_label.refine_cam_stacks`,
``par.*``) refines three score stacks, whose background planes are ``cam.fg_thresh``, ``cam.bg_thresh`` and
``cam.infer_bg_thresh``. Two masks are written::

    OUT/SegmentationClassPseudo/<id>.png       dual threshold (fg_thresh / bg_thresh): the class where the fg_thresh
                                               stack says foreground, background where both stacks say background,
                                               255 (data.ignore_index) where they disagree: the training step's
                                               pseudo_label_targets on the whole image (no crop, no augmentation)
    OUT/SegmentationClassPseudoDense/<id>.png  the infer_bg_thresh stack alone: every pixel a class ("every pixel",
                                               what the paper's Table 3 scores, as tools/eval_cams.py --pseudo)

Both are VOC-palette PNGs of class indices. With ``crf``, each of the three refined stacks, normalised to
probabilities, goes through the dense CRF (``infer.crf.*``; the three together over one pair of lattices,
:func:`wsss.inference.crf.crf_labels_stacked`; on a GPU a batch's images share mean-field runs,
:meth:`~wsss.inference.crf.CrfPool.submit_stacked`) before its argmax, and the two CRF'd dual-threshold stacks are then
combined by the same rule, so pixels stay 255 where the CRF-refined stacks disagree (AffinityNet's CRF of the low and
high background scores): the CRF moves the uncertain band to image edges, it never fills it.

The CAM pass runs in eval mode and float32 (on a GPU in bf16 autocast with ``infer.dtype="bfloat16"``, recorded in
``run.json``). The training step runs it in train mode (the reference's habit), which equals eval mode when
``model.drop_path_rate`` is 0 and there is no dropout, the reference config; with drop-path train mode would make the
masks random. ``train.cam_dtype`` (bf16 on a GPU) is a training speed option and is not followed here.

Sharding: every rank lists the same sorted ids and takes :func:`~wsss.inference.folder.sources.own_shard` of them
(balanced
by pixels); each mask is written atomically, and an image whose two masks exist is skipped unless ``overwrite``, so a
re-run, with the same or another number of ranks, finishes the rest. Rank 0 gathers what every rank did and writes
the split file, ``image_labels.json``, ``summary.json`` and the second-stage configs
(:mod:`wsss.inference.exports.second_stage`).

OUT never holds two kinds of masks under one ``run.json``:

- ``run.json``, written before any mask, holds the settings the masks depend on, the checkpoint among them by its
  content (the SHA-256 of the file read; its path is recorded, not compared): a checkpoint copied over the one of a
  killed export is another checkpoint. A re-run with other settings over any existing mask (of a complete export, a
  killed one, another split) is refused (``overwrite`` redoes them).
- Masks without a readable ``run.json`` (deleted, truncated) are of unknown settings: a run over them is refused
  too, naming ``overwrite``.
- An ``overwrite`` run with other settings (or over masks of unknown settings) names them in ``run.json``
  (``mixed_with``) until it has redone every mask in OUT, so resuming it after a kill without ``overwrite`` is
  refused too.
- OUT is locked for the run (``export.lock``, an exclusive ``flock`` that rank 0 holds from before it reads
  ``run.json`` to the end; :func:`wsss.utils.folder_lock.hold_lock`): a second export into the same OUT stops at
  once, naming the holder.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader
from tqdm import tqdm

from wsss.cam import multiscale_cam
from wsss.config import Config, apply_options, load_config
from wsss.data.classes import voc_palette
from wsss.data.folder import Skipped
from wsss.data.transforms import channel_constants, denormalize, normalize
from wsss.data.voc import VOCClsDataset, mask_file
from wsss.inference.crf import CrfPool
from wsss.inference.exports.second_stage import write_second_stage
from wsss.inference.folder.batching import ImageList, SizeBuckets, default_batch_size, identity
from wsss.inference.folder.loop import FileWriters
from wsss.inference.folder.plan import LATER_SETTINGS
from wsss.inference.folder.runner import check_bounds
from wsss.inference.folder.sources import Source, own_shard, save_output, writing
from wsss.model_file import config_from_checkpoint, model_from_checkpoint, read_model_file
from wsss.models.segmentor import WSSSModel
from wsss.par import PAR
from wsss.pseudo_label import combine_dual_threshold, refine_cam_stacks, stack_labels
from wsss.utils.distributed import all_gather_objects, barrier, raise_on_every_rank, rank_and_world
from wsss.utils.fileio import IMAGE_EXTENSIONS, atomic_write_text, remove_stale_temporaries, save_mask
from wsss.utils.folder_lock import hold_lock
from wsss.utils.lifetime import die_with_parent
from wsss.utils.startup import threads_beside
from wsss.utils.tensors import fp32_products, model_dtype, model_precision, to_device

__all__ = ["DENSE_DIR", "PSEUDO_DIR", "ExportOptions", "ExportSummary", "PendingMasks", "export_pseudo_labels",
           "pseudo_masks", "submit_pseudo_masks"]

PSEUDO_DIR = "SegmentationClassPseudo"
"""Dual-threshold masks under OUT: 255 where uncertain (the second stage's training targets)."""
DENSE_DIR = "SegmentationClassPseudoDense"
"""Single-threshold masks under OUT: every pixel a class (the "every pixel" score)."""
MASK_DIRS = (PSEUDO_DIR, DENSE_DIR)
SPLIT_DIR = "ImageSets/Segmentation"
"""Where the split file of the exported ids goes under OUT."""
LOCK_FILE = "export.lock"
"""OUT's lock file, held by rank 0 for the whole export."""


@dataclass
class ExportOptions:
    """What ``tools/make_pseudo_labels.py`` asks for.

    Attributes:
        split: Split name or file of the dataset; None: ``data.train_split``.
        config: A config file whose ``data``, ``cam``, ``par`` and ``infer.crf`` replace the checkpoint's (the model
            is always the checkpoint's).
        cfg_options: ``{"a.b": value}`` overrides (``--cfg-options``).
        crf: Refine the stacks with the dense CRF.
        crf_workers: CRF processes per rank; None takes ``infer.crf.workers``.
        threads: The torch threads the user chose for this rank (``--threads`` or ``OMP_NUM_THREADS``), kept; None:
            once the CRF processes are known, the CPUs they leave (:func:`wsss.utils.startup.threads_beside`).
        batch_size: Most same-size images per forward batch (also at most ``infer.batch_pixels`` pixels); None:
            ``infer.batch_size`` on a GPU, ``infer.cpu_batch_size`` elsewhere. The masks do not depend on it.
        num_workers: Image decoding processes (0: in the main process); None: ``data.num_workers`` on a GPU, 0 on the
            CPU, where a decoding process takes a CPU from the model's threads
            (:func:`~wsss.utils.startup.threads_beside`) and costs more than it saves (docs/benchmarks.md).
        write_threads: Threads encoding and writing the masks while the model goes on (0: in the main thread).
        overwrite: Redo images whose masks exist (and accept other settings than ``run.json``'s).
        progress: Show a progress bar (rank 0).
    """

    split: str | None = None
    config: str | Path | None = None
    cfg_options: dict[str, Any] = field(default_factory=dict)
    crf: bool = False
    crf_workers: int | None = None
    threads: int | None = None
    batch_size: int | None = None
    num_workers: int | None = None
    write_threads: int = 2
    overwrite: bool = False
    progress: bool = True


@dataclass
class ExportSummary:
    """What an export did (every rank's work, merged on rank 0).

    Attributes:
        output: OUT.
        split: The split exported.
        images: Images in the split.
        exported: Ids whose two masks exist now, in the split's order (the split file's lines, without extension).
        done: Images computed in this run.
        existing: Images kept from an earlier run.
        skipped: Images not exported (unreadable, over ``data.max_image_pixels``), with the reason.
        files: The split file and the second-stage files written, by name.
        eval_commands: The ``tools/eval.py`` commands that score the masks, when the dataset has masks for them.
        seconds: Wall time of this rank's loop (not written to ``summary.json``, which stays reproducible).
    """

    output: Path
    split: str
    images: int = 0
    exported: list[str] = field(default_factory=list)
    done: int = 0
    existing: int = 0
    skipped: list[Skipped] = field(default_factory=list)
    files: dict[str, Path] = field(default_factory=dict)
    eval_commands: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "split": self.split,
            "images": self.images,
            "exported": len(self.exported),
            "done": self.done,
            "existing": self.existing,
            "skipped": [asdict(s) for s in self.skipped],
            "masks": {"uncertain_255": PSEUDO_DIR, "every_pixel": DENSE_DIR},
            "files": {k: str(v) for k, v in self.files.items()},
        }

    def format(self, max_lines: int = 20) -> str:
        lines = [
            f"pseudo labels of split {self.split}: {len(self.exported)} of {self.images} images exported ({self.done} "
            f"now in {self.seconds:.1f} s on rank 0, {self.existing} kept from an earlier run; --overwrite redoes "
            f"them), {len(self.skipped)} skipped"
        ]
        lines += [f"  skipped {s.path}: {s.reason}" for s in self.skipped[:max_lines]]
        if len(self.skipped) > max_lines:
            lines.append(f"  ... and {len(self.skipped) - max_lines} more, see {self.output / 'summary.json'}")
        lines.append(f"masks: {self.output / PSEUDO_DIR} (255 = uncertain), {self.output / DENSE_DIR} (every pixel)")
        lines += [f"wrote {path}" for path in self.files.values()]
        lines += [f"score: {command}" for command in self.eval_commands]
        return "\n".join(lines)


def mask_name(image_id: str) -> str:
    """``image_id`` without its image extension (``a/b.jpg`` and ``a/b`` -> ``a/b``): the masks' and the split
    file's name, as :func:`wsss.data.voc.mask_file` names the ground truth."""
    suffix = PurePosixPath(image_id).suffix
    return image_id[: -len(suffix)] if suffix.lower() in IMAGE_EXTENSIONS else image_id


@dataclass
class PendingMasks:
    """The two masks of one image (:func:`submit_pseudo_masks`): ready, or waiting for the CRF's jobs."""

    ready: tuple[np.ndarray, np.ndarray] | None
    """The (H, W) uint8 masks, made without the CRF; None while the CRF's jobs run."""
    keys: Tensor | None = None
    """(K,) class of each channel the CRF got, on the host."""
    jobs: list[Future] = field(default_factory=list)
    """The CRF labels of the three stacks (high, low and single background plane)."""
    ignore_index: int = 255

    def done(self) -> bool:
        return self.ready is not None or all(job.done() for job in self.jobs)

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """The (H, W) uint8 dual-threshold and single-threshold masks; waits for the CRF; raises a job's error."""
        if self.ready is not None:
            return self.ready
        # each map's labels index its channels: their classes (on the host, where the labels are)
        high, low, single = (self.keys.take(torch.from_numpy(job.result()).long()) for job in self.jobs)
        certain = combine_dual_threshold(high[None], low[None], None, self.ignore_index)[0]
        return certain.to(torch.uint8).numpy(), single.to(torch.uint8).numpy()


def pseudo_masks(
    model: WSSSModel,
    image: Tensor,
    labels: Tensor,
    cfg: Config,
    mean: tuple[float, ...] | Tensor,
    std: tuple[float, ...] | Tensor,
    par: PAR,
    crf: CrfPool | None = None,
    raw: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The two pseudo masks of one full image (see the module docstring): :func:`submit_pseudo_masks`, waited for.

    Args:
        model: The model, in the mode the caller chose (eval for the export).
        image: (1, 3, H, W) normalised image.
        labels: (1, C-1) multi-hot image-level labels.
        cfg: ``cam.*``, ``par.scale``, ``data.ignore_index``.
        mean: Normalisation mean of ``image`` (values, or :func:`~wsss.data.transforms.channel_constants` there).
        std: Normalisation std.
        par: The refinement module (``par.*``), on the image's device.
        crf: A CRF pool (``infer.crf.*``), or None for no CRF.
        raw: (H, W, 3) uint8 RGB of the image, the CRF's bilateral guide (with ``crf``).

    Returns:
        (H, W) uint8 masks: the dual-threshold one (``data.ignore_index`` where uncertain) and the single-threshold
        one (every pixel a class).
    """
    return submit_pseudo_masks(model, image, labels, cfg, mean, std, par, crf, [raw])[0].result()


@torch.no_grad()
def submit_pseudo_masks(
    model: WSSSModel,
    images: Tensor,
    labels: Tensor,
    cfg: Config,
    mean: tuple[float, ...] | Tensor,
    std: tuple[float, ...] | Tensor,
    par: PAR,
    crf: CrfPool | None = None,
    raws: list[np.ndarray | None] | None = None,
    counts: list[int] | None = None,
) -> list[PendingMasks]:
    """The CAMs and PAR of a batch of same-size full images (:func:`pseudo_masks`' arguments, ``images`` (B, 3, H, W),
    ``labels`` (B, C-1), ``raws`` their pixels), one :class:`PendingMasks` per image: without the CRF the masks of the
    whole batch come to the host in one copy; with ``crf`` each image's three stacks are queued as one job (with CRF
    workers the call returns before they finish, so the next batch's CAMs run beside them). ``counts``: the number of
    classes in each row of ``labels``, counted on the host (None: read from the device, a sync)."""
    with model_precision(cfg.infer.fp32_precision, cfg.infer.dtype, images.device):
        cams = multiscale_cam(model.cam, images, labels, cfg.cam.scales, one_image_at_a_time=True)
    rgb = denormalize(images.float(), mean, std)
    planes = (cfg.cam.fg_thresh, cfg.cam.bg_thresh, cfg.cam.infer_bg_thresh)
    max_present = None if counts is None else max(counts)
    scores, keys = refine_cam_stacks(rgb, cams, labels, planes, par, cfg.par.scale, max_present)  # (3, B, K, H, W)
    ignore = cfg.data.ignore_index
    if crf is None:
        high, low, single = stack_labels(scores, keys)  # refine_cams_with_par's argmax
        certain = combine_dual_threshold(high, low, None, ignore)
        masks = torch.stack([certain, single], dim=1).to(torch.uint8).cpu().numpy()  # (B, 2, H, W): one copy
        return [PendingMasks((m[0], m[1])) for m in masks]
    counts = counts if counts is not None else (keys > 0).sum(dim=1).tolist()
    stacks = [scores[:, i, : 1 + c] for i, c in enumerate(counts)]  # each image's channels, without the padding
    # each image's three stacks over one pair of lattices (torch backend); on a GPU the batch's images together
    jobs = crf.submit_stacked(raws or [None] * len(images), [s / s.sum(dim=1, keepdim=True) for s in stacks])
    keys = keys.cpu()  # one copy for the batch (on a GPU the CRF's labels came to the host already)
    return [PendingMasks(None, keys[i, : 1 + c], jobs[i], ignore) for i, c in enumerate(counts)]


def export_pseudo_labels(
    checkpoint: str | Path,
    output: str | Path,
    options: ExportOptions | None = None,
    device: str | torch.device = "cpu",
) -> ExportSummary:
    """Write the pseudo masks of every image of a split (this rank's share under ``torchrun``) and, on rank 0, the
    split file, ``image_labels.json``, ``summary.json`` and the second-stage configs.

    Args:
        checkpoint: A wsss checkpoint or export; the model, its normalisation and classes come from it.
        output: OUT (see the module docstring for the layout).
        options: What to export and how.
        device: Where the model runs.

    Returns:
        The summary; on rank 0 it covers every rank's work, elsewhere this rank's.

    Raises:
        FileNotFoundError: The checkpoint, the dataset, its split or an image is missing.
        ValueError: A config error, the dataset's classes differ from the checkpoint's, an output would replace an
            input, another export holds OUT, or OUT holds masks made with other or unknown settings (without
            ``overwrite``).
        OutputError: A mask or file could not be written (one line naming it).
        ImportError: ``crf`` without pydensecrf2.
    """
    opts = options or ExportOptions()
    plan = _plan(checkpoint, Path(output), opts, device)  # every check that needs no OUT: a refusal creates nothing
    with _own_output(plan.output):
        return _run(plan, opts, device)


@dataclass
class _Plan:
    """What an export will do, decided before OUT is touched."""

    checkpoint: str | Path
    ckpt: dict[str, Any]
    cfg: Config
    split: str
    dataset: VOCClsDataset
    output: Path
    split_file: Path
    paths: dict[str, tuple[Path, Path]]
    """The two masks of each image id."""
    settings: dict[str, Any]
    """What the masks depend on (``run.json``)."""

    def finished(self, image_id: str) -> bool:
        return all(p.is_file() for p in self.paths[image_id])


def _plan(checkpoint: str | Path, output: Path, opts: ExportOptions, device: str | torch.device) -> _Plan:
    check_bounds([("--crf-workers", opts.crf_workers, 0, ""), ("--batch-size", opts.batch_size, 1, ""),
                  ("--workers", opts.num_workers, 0, ""), ("--write-threads", opts.write_threads, 0, "")])  # fmt: skip
    ckpt, digest = _read_checkpoint(checkpoint)
    if opts.config is not None:
        cfg = load_config(opts.config, opts.cfg_options)
    else:
        cfg = config_from_checkpoint(ckpt)
        cfg = apply_options(cfg, opts.cfg_options) if opts.cfg_options else cfg
    split = opts.split or cfg.data.train_split
    dataset = VOCClsDataset(cfg.data, tuple(ckpt["mean"]), tuple(ckpt["std"]), split=split)
    if list(dataset.classes) != list(ckpt["classes"]):
        raise ValueError(
            f"the dataset's classes {dataset.classes} differ from those {checkpoint} was trained on "
            f"{ckpt['classes']}: give the config of that training (--config) or fix data.classes"
        )
    split_file = output / SPLIT_DIR / f"{Path(split).stem}.txt"
    _check_outputs(output, dataset, split_file)
    paths = {i: (output / PSEUDO_DIR / f"{mask_name(i)}.png", output / DENSE_DIR / f"{mask_name(i)}.png")
             for i in dataset.ids}  # fmt: skip
    return _Plan(checkpoint, ckpt, cfg, split, dataset, output, split_file, paths,
                 _settings(digest, dataset, cfg, opts.crf, device))  # fmt: skip


def _read_checkpoint(path: str | Path) -> tuple[dict[str, Any], str]:
    """The checkpoint and ``sha256:<hex>`` of the file it was read from, its identity for ``run.json``.

    Raises:
        ValueError: The file was replaced or rewritten while it was read (its inode, size or time changed).
    """
    stamp = _stamp(path)
    ckpt = read_model_file(path)  # names a missing or foreign file
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    if _stamp(path) != stamp:
        raise ValueError(f"{path} changed while it was read (replaced or rewritten); run again once it is in place")
    return ckpt, f"sha256:{digest.hexdigest()}"


def _stamp(path: str | Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


@contextmanager
def _own_output(output: Path) -> Iterator[None]:
    """Rank 0 creates OUT and holds its lock (:data:`LOCK_FILE`) while the block runs; when another export holds
    it, or OUT cannot be created, every rank raises."""
    with ExitStack() as stack:
        error = None
        if rank_and_world()[0] == 0:
            try:
                with writing(output):
                    output.mkdir(parents=True, exist_ok=True)
                stack.enter_context(hold_lock(output / LOCK_FILE, lambda holder: _in_use(output, holder)))
            except (OSError, ValueError) as err:
                error = str(err)
        raise_on_every_rank(error)
        yield


def _in_use(output: Path, holder: str) -> ValueError:
    return ValueError(
        f"{output} is in use by another pseudo-label export ({holder}, see {output / LOCK_FILE}); wait for it to end "
        "or give another OUT"
    )


def _run(plan: _Plan, opts: ExportOptions, device: str | torch.device) -> ExportSummary:
    """The export, once OUT is this run's."""
    output, cfg, dataset = plan.output, plan.cfg, plan.dataset
    mixed = _check_previous_settings(output, plan.settings, opts.overwrite)
    rank, _ = rank_and_world()
    if rank == 0:
        own = [(output, False), (output / SPLIT_DIR, False), *((output / d, True) for d in MASK_DIRS)]
        for folder, recursive in own:  # OUT's own folders only; before the barrier: no rank writes yet
            remove_stale_temporaries(folder, recursive)
        _write_run_file(output, plan.settings, mixed, plan.checkpoint, _recorded(cfg, device))
    barrier()

    sources = sorted((Source(i, dataset.image_path(i)) for i in dataset.ids), key=lambda s: s.rel)
    todo = [s for s in own_shard(sources) if opts.overwrite or not plan.finished(s.rel)]
    skipped: list[Skipped] = []
    tic = time.perf_counter()
    done = _export_images(plan, opts, todo, skipped, device) if todo else []
    summary = ExportSummary(output=output, split=plan.split, images=len(sources), seconds=time.perf_counter() - tic)
    parts = all_gather_objects((done, skipped))
    summary.done = sum(len(d) for d, _ in parts)
    summary.skipped = sorted((s for _, part in parts for s in part), key=lambda s: s.path)
    if rank != 0:
        return summary
    exported = [i for i in dataset.ids if plan.finished(i)]
    summary.exported = [mask_name(i) for i in exported]
    summary.existing = len(exported) - summary.done
    if mixed and summary.existing == 0 and _mask_files(output) == {f"{mask_name(i)}.png" for i in exported}:
        _write_run_file(output, plan.settings, [], plan.checkpoint, _recorded(cfg, device))  # one kind again
    _write_merged(summary, dataset, cfg, plan.checkpoint, plan.split_file, exported)
    return summary


def _export_images(
    plan: _Plan, opts: ExportOptions, todo: list[Source], skipped: list[Skipped], device: str | torch.device
) -> list[str]:
    """Export the masks of ``todo``; returns the ids whose masks were written, adds the unreadable ones to ``skipped``.

    Images are decoded in worker processes (:class:`ExportOptions`' ``num_workers``) and run in batches of one size
    (:class:`~wsss.inference.folder.batching.SizeBuckets`: ``batch_size`` images, ``infer.batch_pixels`` pixels); the
    masks are written by ``opts.write_threads`` threads (:class:`~wsss.inference.folder.loop.FileWriters`), in order.
    With CRF workers, up to two images per worker wait for their CRF (besides the batch just submitted) while the next
    images' CAMs run: a bounded queue, memory does not grow with the split.
    """
    cfg, dataset = plan.cfg, plan.dataset
    batch_size = default_batch_size(cfg.infer, device) if opts.batch_size is None else opts.batch_size
    on_gpu = torch.device(device).type == "cuda"
    workers = opts.num_workers if opts.num_workers is not None else cfg.data.num_workers if on_gpu else 0
    workers = workers if len(todo) > 1 else 0
    done: list[str] = []
    with ExitStack() as stack:
        # the CRF workers start before the model exists (see CrfPool); on the CPU the torch backend's run there too
        pool = stack.enter_context(CrfPool(cfg.infer.crf, opts.crf_workers, device=device)) if opts.crf else None
        crf_workers = pool.workers if pool is not None else 0
        if crf_workers or workers:  # their CPUs are not the model's
            threads_beside(crf_workers + workers, opts.threads)
        model, _ = model_from_checkpoint(plan.ckpt, device)
        par = PAR.from_config(cfg.par).to(device)
        mean, std = (channel_constants(plan.ckpt[key], device) for key in ("mean", "std"))  # uploaded once
        palette = voc_palette()
        writers = FileWriters(opts.write_threads, batch_size + 2 * opts.write_threads)
        stack.callback(writers.close)  # an error or an interrupt: the writes under way finish, no other starts
        pending: deque[tuple[str, PendingMasks]] = deque()

        def run(batch: list[tuple[str, np.ndarray]]) -> None:
            images = torch.stack([normalize(raw, mean, std, device) for _, raw in batch])
            present = [dataset.labels[rel] for rel, _ in batch]
            labels = to_device(torch.from_numpy(np.stack(present).astype(np.float32)), device)
            masks = submit_pseudo_masks(model, images, labels, cfg, mean, std, par, pool, [raw for _, raw in batch],
                                        [int(p.sum()) for p in present])  # fmt: skip
            pending.extend((rel, m) for (rel, _), m in zip(batch, masks, strict=True))
            write(final=False)

        def write(final: bool) -> None:
            """Hand the finished images' masks to the writers (at the end, every image's, and wait for them)."""
            waiting = 0 if final else 2 * crf_workers
            while pending and (len(pending) > waiting or pending[0][1].done()):
                rel, masks = pending.popleft()
                writes = [partial(save_output, path, save_mask, mask, palette)
                          for path, mask in zip(plan.paths[rel], masks.result(), strict=True)]  # fmt: skip
                writers.submit(rel, writes)
            done.extend(writers.finished(block=final))

        loader = DataLoader(ImageList(todo, cfg.data.max_image_pixels), batch_size=None, num_workers=workers,
                            collate_fn=identity, worker_init_fn=partial(die_with_parent, os.getpid()))  # fmt: skip
        buckets = SizeBuckets(batch_size, cfg.infer.batch_pixels)
        show = opts.progress and rank_and_world()[0] == 0
        for item in tqdm(loader, desc="pseudo labels", unit="img", disable=not show, dynamic_ncols=True):
            src = todo[item["index"]]
            if item["image"] is None:
                skipped.append(Skipped(src.rel, item["error"]))
                continue
            for batch in buckets.add((src.rel, item["image"]), item["image"].shape):
                run(batch)
        for batch in buckets.flush():
            run(batch)
        write(final=True)
    return done


def _settings(
    digest: str, dataset: VOCClsDataset, cfg: Config, crf: bool, device: str | torch.device
) -> dict[str, Any]:
    """What the masks depend on, as JSON values (``run.json``): the checkpoint by its content (``digest``), and the CAM
    pass's precision (``infer.dtype``: bf16 autocast on a GPU moves more than float rounding; docs/reference.md row
    23)."""
    crf_config = {k: v for k, v in asdict(cfg.infer.crf).items() if k != "workers"} if crf else None
    settings = {
        "checkpoint": digest, "label_file": os.path.realpath(dataset.label_path),
        "classes": list(dataset.classes), "cam": asdict(cfg.cam), "par": asdict(cfg.par),
        "ignore_index": cfg.data.ignore_index, "crf": crf, "crf_config": crf_config,
        "dtype": model_dtype(cfg.infer.dtype, device),
    }  # fmt: skip
    return json.loads(json.dumps(settings))


def _check_previous_settings(output: Path, settings: dict[str, Any], overwrite: bool) -> list[str]:
    """Refuse to add masks made with other settings than ``run.json``'s to any mask in OUT (of a complete export,
    a killed one, another split), to masks whose ``run.json`` is missing or unreadable (their settings are
    unknown), and to resume an ``overwrite`` run with other settings that did not redo every mask (OUT then holds
    two kinds: ``run.json``'s ``mixed_with``).

    Returns:
        The settings in which OUT's masks may differ from ``settings`` (``overwrite`` over masks of other or
        unknown settings): ``run.json`` names them until a run has redone every mask in OUT.

    Raises:
        ValueError: Without ``overwrite``, OUT holds masks and other or unknown settings, or two kinds of masks.
    """
    masks = _mask_files(output)
    if not masks:
        return []
    try:
        previous = json.loads((output / "run.json").read_text())
    except (OSError, ValueError):
        previous = None
    if not isinstance(previous, dict):
        if overwrite:
            return sorted(settings)  # any of them may differ until every mask is redone
        raise ValueError(
            f"{output} holds the pseudo labels of {len(masks)} images without a readable {output / 'run.json'} "
            "(missing or damaged), so their settings are unknown; --overwrite redoes every image, or give another OUT"
        )
    earlier = previous.get("mixed_with") or []
    earlier = earlier if isinstance(earlier, list) else sorted(settings)
    differ = (k for k in settings if previous.get(k, LATER_SETTINGS.get(k)) != settings[k])
    changed = sorted({*differ, *map(str, earlier)})
    if overwrite or not changed:
        return changed
    if earlier:
        raise ValueError(
            f"{output} holds pseudo labels of two kinds: an --overwrite run with other settings ({', '.join(earlier)} "
            f"differ, {output / 'run.json'}) stopped before it redid every image; --overwrite redoes every image, "
            "or give another OUT"
        )
    raise ValueError(
        f"{output} holds pseudo labels made with other settings ({', '.join(changed)} differ from "
        f"{output / 'run.json'}); --overwrite redoes every image, or give another OUT"
    )


def _recorded(cfg: Config, device: str | torch.device) -> dict[str, Any]:
    """What ``run.json`` records beside the settings and never compares: like the device itself, the GPU's float32
    products move a few pixels at float rounding (docs/reference.md row 21), as the folder run's ``run.json``."""
    return {"fp32_precision": fp32_products(cfg.infer.fp32_precision, device)}


def _write_run_file(output: Path, settings: dict[str, Any], mixed: list[str], checkpoint: str | Path,
                    recorded: dict[str, Any]) -> None:  # fmt: skip
    """``run.json``: ``settings``, the checkpoint's path (for the reader; the digest is what is compared), ``recorded``
    (:func:`_recorded`), and while OUT may hold masks of other settings, which ones (``mixed_with``)."""
    payload = {**settings, "checkpoint_path": os.path.realpath(checkpoint), **recorded}
    payload = {**payload, "mixed_with": mixed} if mixed else payload
    with writing(output / "run.json"):
        atomic_write_text(output / "run.json", json.dumps(payload, indent=2) + "\n")


def _mask_files(output: Path) -> set[str]:
    """The masks in OUT's mask folders, by name relative to their folder (either folder, any split)."""
    return {p.relative_to(output / d).as_posix() for d in MASK_DIRS for p in (output / d).rglob("*.png")}


def _check_outputs(output: Path, dataset: VOCClsDataset, split_file: Path) -> None:
    """Refuse an OUT where a mask folder is the dataset's image or mask folder, or the split file an input."""
    inputs = {
        os.path.realpath(dataset.root / dataset.cfg.image_dir): "image folder",
        os.path.realpath(dataset.root / dataset.cfg.mask_dir): "mask folder",
        os.path.realpath(dataset.split_file): "split file",
        os.path.realpath(dataset.label_path): "label file",
    }
    for written in (output / PSEUDO_DIR, output / DENSE_DIR, split_file):
        clash = inputs.get(os.path.realpath(written))
        if clash is not None:
            raise ValueError(f"{written} is the dataset's {clash}, which the export would overwrite; give another OUT")


def _write_merged(
    summary: ExportSummary,
    dataset: VOCClsDataset,
    cfg: Config,
    checkpoint: str | Path,
    split_file: Path,
    exported: list[str],
) -> None:
    """Rank 0, after every rank finished: the split file, ``image_labels.json``, the second-stage configs and
    ``summary.json``; the ``tools/eval.py`` commands when the dataset has masks for the exported images."""
    output, classes = summary.output, list(dataset.classes)
    with writing(split_file):
        atomic_write_text(split_file, "".join(f"{name}\n" for name in summary.exported))
    images = {mask_name(i): {"present": [classes[k + 1] for k in np.flatnonzero(dataset.labels[i])]} for i in exported}
    labels_file = output / "image_labels.json"
    with writing(labels_file):
        atomic_write_text(labels_file, json.dumps({
            "classes": classes, "label_file": str(dataset.label_path), "images": images,
        }, indent=1) + "\n")  # fmt: skip
    header = (
        f"Pseudo labels of {len(exported)} images of split {summary.split} of {dataset.root}, made by "
        f"tools/make_pseudo_labels.py from {checkpoint}."
    )
    with writing(output):
        summary.files = {
            "split": split_file,
            "image_labels": labels_file,
            **write_second_stage(
                output, cfg, dataset.root, split_file, output / PSEUDO_DIR,
                [dataset.image_path(i).suffix for i in exported], classes, header,
            ),
        }  # fmt: skip
    try:
        gt = exported and all(mask_file(dataset.root, i, cfg.data).is_file() for i in exported)
    except ValueError:  # a mask resolving outside the root: no scoring offered
        gt = False
    if gt:
        gt_dir, ids = dataset.root / cfg.data.mask_dir, f"--ids {split_file}"
        summary.eval_commands = [
            f"python tools/eval.py {output / DENSE_DIR} {gt_dir} {ids}   # every pixel (the paper's Table 3)",
            f"python tools/eval.py {output / PSEUDO_DIR} {gt_dir} {ids} --certain-only   # certain pixels only",
        ]
    summary_file = output / "summary.json"
    with writing(summary_file):
        atomic_write_text(summary_file, json.dumps(summary.to_dict(), indent=2) + "\n")
