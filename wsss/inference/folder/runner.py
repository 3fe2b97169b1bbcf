"""The inference loop over an image folder or a VOC split: decoding, batching, test-time augmentation
(:mod:`wsss.models.tta`), the dense CRF pool (:mod:`wsss.inference.crf`) and the outputs.

:func:`run_inference` is what ``tools/infer.py`` calls; every batch goes through
:meth:`wsss.inference.predictor.Segmenter.run_batch`, as the predictor a Python user calls does. Output layout
under OUTPUT, mirroring each image's path relative to INPUT (a folder, recursive) or to ``INPUT/JPEGImages``
(a VOC root with a split)::

    masks/<rel>.png       palette PNG (VOC palette), values = class indices in [0, C); with
                          infer.mask_classes = "present" (default) only background and the present classes
    overlays/<rel>.jpg    mask blended over the image (--overlay)
    cams/<rel>.jpg        CAM heatmap over the image (--cams): max over the present classes, under a band naming
                          them with their scores and the heatmap's colour bar (0 to 1), each class named at its
                          CAM's peak (:func:`~wsss.inference.folder.visualize.cam_legend`)
    logits/<rel>.npy      (C, ceil(H/4), ceil(W/4)) float16 TTA logits at 1/4 resolution (--logits);
                          bilinear (align_corners=False) upsampling to (H, W) recovers the full map
    thumbs/<rel>.jpg      input thumbnail, longest side 256 (--gallery)
    mask_thumbs/<rel>.png the mask at the thumbnail's size (nearest neighbour, palette PNG: the legend's colours
                          exactly; --gallery, written with index.html)
    class_cams/<rel>/<k>.jpg  the CAM of present class k (its index) resized from the model's resolution to the
                          thumbnail and blended over it (--gallery)
    gt/<rel>.png          ground truth at the thumbnail's size, palette PNG (--gallery on a VOC split with masks)
    index.html            gallery, one row per image: input, mask, mask over the input, ground truth, one CAM
                          cell per present class captioned with its name and score; a colour legend; fits
                          1400 px (CAM cells wrap) (--gallery, which implies --overlay --cams)
    labels/<rel>.json     "present": the classes the classifier predicts present (sigmoid > infer.cls_thresh,
                          or its top-1 class when none is: "top1_fallback": true) that the mask shows, so
                          the mask, "present", the CAMs and the gallery's captions agree; "scores": every
                          foreground class's probability (written with the image's other outputs, so an
                          interrupted run loses none)
    image_labels.json     every image's labels/ entry in one file, merged at the end of each run
    run.json              the settings of the last run; summary.json: what it did

``<rel>`` is the input's relative path with its extension replaced; :class:`~wsss.inference.folder.layout.OutputLayout`
owns this layout. Every file is written atomically; the temporaries a killed run of this host left behind in these
folders are removed at the start of the next, and nothing else is ever deleted (see
:mod:`wsss.inference.folder.layout`).
An image whose requested outputs all exist is skipped (not even decoded) unless ``overwrite``.

A run is three steps, each its own module: the plan (:mod:`wsss.inference.folder.plan`: list the images, prepare OUTPUT,
split off the images already done), the loop (:mod:`wsss.inference.folder.loop`: batching, the model, the dense CRF,
the files of each image) and the merge (:mod:`wsss.inference.folder.merge`: one summary, ``image_labels.json``, the
gallery, ``summary.json``).

Dense CRF (``crf=True``): softmax of the TTA logits of the classes the mask may hold, then
:class:`wsss.inference.crf.CrfPool`. With ``infer.crf.backend = torch`` (default) on a GPU the images of a model
batch go through one batched CRF call on the model's device. On the CPU (either backend) and with ``pydensecrf``
the jobs go to ``CrfConfig.workers`` processes as soon as an image's logits exist and its mask is written when the
job finishes, so the model loop does not wait for the CRF (it waits only when more than ``2 * workers +
batch_size`` jobs are queued, to bound memory). Both in :class:`~wsss.inference.folder.loop.CrfJobs`.

Size cap: the model sees every image with its longest side at most ``max_size`` (``infer.max_size``, default
1024; 0: no cap of its own), and never a side over 2048 px at the largest TTA scale
(:func:`~wsss.inference.predictor.longest_side`; ``run.json`` records the cap that applied); every output comes back
at the image's own size a band of rows of at most ``max_size**2`` pixels at a time
(:class:`~wsss.inference.predictor.BatchOutputs`), so no single op runs long on a huge image and no full-size float
map is held: a 12000 x 12000 photo costs its uint8 pixels, its mask and bands. With ``crf``, the dense CRF's memory
is at most ``infer.crf.memory_mib`` per call: a larger image runs it at a reduced resolution
(:mod:`wsss.inference.crf`).

Interrupts: ``tools/infer.py`` turns SIGTERM into ``SystemExit`` (:func:`wsss.utils.lifetime.exit_on_sigterm`),
raised at the first Python step after the running torch op, which is between two scales, two bands or two
images: with the size cap no op takes more than seconds, so SIGTERM ends a run within seconds. Every finished
image's outputs are whole (the mask, written last, marks it finished) and a half-written file is never left in
place; a re-run finishes the rest.

A full disk: the run stops at the first output that cannot be written (an image being written beside it by another
of the ``write_threads`` finishes, none queued after it starts), still writes ``image_labels.json``, the
gallery and ``summary.json`` for the images finished (where space allows) and raises
:class:`~wsss.inference.folder.sources.OutputError`, one line naming the file and what was kept.

Path safety (and why an output never lands on an input): see :mod:`wsss.inference.folder.sources`.

Under ``torchrun`` (``tools/infer.py --launcher pytorch``): rank 0 lists the images, drops name collisions and
names too long, and sends that one listing to every rank (a file renamed or added while the ranks start changes
nothing: every rank works on the same list); rank 0 prepares OUTPUT (stale temporaries, ``run.json``) while the
others wait; each rank then takes its share (:func:`~wsss.inference.folder.sources.own_shard`: balanced by pixels, the
same split whatever is already written) and runs the loop above on it with its own decoders and CRF pool; the
parts are gathered and every listed image ends finished or named as skipped (a file gone by the time its rank reads
it is skipped, unreadable); rank 0 writes ``image_labels.json``, the gallery and ``summary.json``, and every rank
returns the merged summary after a last barrier. A rank with no share still joins every collective. A killed rank
ends the job through torchrun; its finished images are whole, and any re-run (any number of ranks) skips them.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from wsss.config import ConfigError, apply_options
from wsss.inference.folder.batching import default_batch_size
from wsss.inference.folder.layout import OutputLayout
from wsss.inference.folder.loop import CrfJobs, InferenceLoop, LoopSetup
from wsss.inference.folder.merge import InferenceSummary, RankPart, merge_parts, stopped, write_run_files
from wsss.inference.folder.plan import list_inputs, prepare_output, split_done
from wsss.inference.folder.sources import OutputError, own_shard
from wsss.inference.predictor import Segmenter, longest_side
from wsss.model_file import config_from_checkpoint, read_model_file
from wsss.utils.distributed import all_gather_objects, barrier, rank_and_world
from wsss.utils.startup import threads_beside
from wsss.utils.tensors import fp32_products, model_dtype

__all__ = [
    "InferenceOptions", "InferenceSummary", "check_bounds", "check_scales", "default_output", "run_inference",
]  # fmt: skip


@dataclass
class InferenceOptions:
    """What :func:`run_inference` computes and writes.

    Attributes:
        scales: TTA scales; None takes ``infer.scales`` of the checkpoint's config.
        flip: Horizontal-flip TTA; None takes ``infer.flip`` of the checkpoint's config.
        crf: Refine the masks with the dense CRF (constants: the checkpoint's ``infer.crf``).
        overlay: Write mask overlays. cams: write CAM heatmaps. logits: write 1/4-size float16 logits.
        gallery: Write thumbnails and ``index.html`` (implies overlay and cams).
        batch_size: Most images per forward batch (same-size images only; also at most ``infer.batch_pixels``
            pixels); None takes ``infer.batch_size`` of the checkpoint's config on a GPU, ``infer.cpu_batch_size`` on
            the CPU.
        overwrite: Redo images whose outputs exist.
        num_workers: Image decoding processes (0: in the main process).
        write_threads: Threads encoding and writing the outputs while the model goes on (0: in the main thread).
        crf_workers: CRF processes (``pydensecrf``, or any backend on the CPU); None takes ``infer.crf.workers``
            (0: in the main process).
        threads: The torch threads the user chose (``--threads`` or ``OMP_NUM_THREADS``), kept; None: once the CRF
            processes are known, the CPUs they and the decoding processes leave
            (:func:`wsss.utils.startup.threads_beside`).
        max_size: Longest side an image is brought to before the scales (0: no cap of its own, 2048 px over the
            largest scale still bounds it); None takes ``infer.max_size`` (see :class:`Segmenter`).
        progress: Show a progress bar.
        cfg_options: ``{"infer.key": value}`` overrides of the checkpoint's inference settings (``--cfg-options``).
        follow_symlinks: Read symlinks to regular image files that resolve outside the input folder.
    """

    scales: Sequence[float] | None = None
    flip: bool | None = None
    crf: bool = False
    overlay: bool = False
    cams: bool = False
    logits: bool = False
    gallery: bool = False
    batch_size: int | None = None
    overwrite: bool = False
    num_workers: int = 2
    write_threads: int = 2
    crf_workers: int | None = None
    threads: int | None = None
    max_size: int | None = None
    progress: bool = True
    cfg_options: dict[str, Any] = field(default_factory=dict)
    follow_symlinks: bool = False

    def check(self) -> None:
        """Refuse values that would run but compute nonsense (a constant mask), naming the ``tools/infer.py`` option.

        Raises:
            ValueError: One line naming the option.
        """
        if self.scales is not None:
            check_scales(self.scales, "--scales")
        bounds = (("--max-size", self.max_size, 0, " (0: no cap)"), ("--batch-size", self.batch_size, 1, ""),
                  ("--workers", self.num_workers, 0, ""), ("--crf-workers", self.crf_workers, 0, ""),
                  ("--write-threads", self.write_threads, 0, ""))  # fmt: skip
        check_bounds(bounds)

    def kinds(self) -> list[str]:
        """Output kinds this run writes for every image."""
        kinds = ["masks", "labels"]
        kinds += ["overlays"] if self.overlay or self.gallery else []
        kinds += ["cams"] if self.cams or self.gallery else []
        kinds += ["logits"] if self.logits else []
        kinds += ["thumbs"] if self.gallery else []
        return kinds


def check_bounds(bounds: Sequence[tuple[str, int | None, int, str]]) -> None:
    """Refuse a value below its bound: ``(option, value, lowest, note)`` each (None: not given).

    Raises:
        ValueError: ``"{option}: must be >= {lowest}{note}, got {value}"``, the first one out of bounds.
    """
    for option, value, low, note in bounds:
        if value is not None and value < low:
            raise ValueError(f"{option}: must be >= {low}{note}, got {value}")


def check_scales(scales: Sequence[float], option: str) -> None:
    """Refuse an empty list of TTA scales or a scale that is not a finite number > 0, naming ``option``.

    Raises:
        ValueError: One line naming ``option``.
    """
    bad = [s for s in scales if not (math.isfinite(s) and s > 0)]
    if not scales or bad:
        raise ValueError(f"{option}: every scale must be a finite number > 0, got {list(scales)}")


def default_output(input_path: str | Path) -> Path:
    """``INPUT_pred`` beside the input folder (``photos/`` -> ``photos_pred/``) or image (``a.jpg`` -> ``a_pred/``)."""
    path = Path(os.path.abspath(input_path))
    return path.with_name((path.stem if path.is_file() else path.name) + "_pred")


def run_inference(
    checkpoint: str | Path,
    input_path: str | Path,
    output: str | Path | None = None,
    split: str | None = None,
    options: InferenceOptions | None = None,
    device: str | torch.device = "cpu",
    list_path: str | Path | None = None,
) -> InferenceSummary:
    """Predict masks (and the optional outputs) for one image, every image of a folder, of a list or of a VOC split.

    Args:
        checkpoint: A wsss checkpoint or export; the model and its preprocessing are rebuilt from it alone.
        input_path: An image file; a folder of images (recursive); with ``list_path`` the folder its paths are
            relative to; with ``split`` a VOC-layout root.
        output: Output folder; default :func:`default_output` of ``input_path``.
        split: A split name or file; images are read from ``input_path/JPEGImages``.
        options: What to compute and write.
        device: Where the model runs.
        list_path: A text file of image paths under ``input_path``, one per line
            (:func:`~wsss.inference.folder.sources.list_file`).

    Returns:
        The :class:`InferenceSummary` (also written to ``output/summary.json``).

    Raises:
        FileNotFoundError: The checkpoint, the input folder or the split is missing.
        ValueError: An option out of range, an OUTPUT where an output could land on an input
            (:meth:`~wsss.inference.folder.layout.OutputLayout.check_input`), or the checkpoint is not a wsss
            checkpoint.
        OutputError: An output could not be written (a full disk); the run stopped there, the images before it
            are complete and ``summary.json`` says so where it could be written.
    """
    opts = options or InferenceOptions()
    opts.check()
    input_path = Path(input_path)
    single = input_path.is_file()
    if single and (split is not None or list_path is not None):
        option = "--split" if split is not None else "--list"
        raise ValueError(f"{option} needs a folder as INPUT, got the file {input_path}")
    if not single and not input_path.is_dir():
        raise FileNotFoundError(f"input not found: {input_path} (an image file or a folder of images)")
    layout = OutputLayout(output if output is not None else default_output(input_path), opts.kinds())
    layout.check_input(input_path.parent if single else input_path)

    ckpt = read_model_file(checkpoint)
    cfg = apply_options(config_from_checkpoint(ckpt), opts.cfg_options, prefix="infer.")
    scales = tuple(cfg.infer.scales if opts.scales is None else opts.scales)
    check_scales(scales, "--scales" if opts.scales is not None else "infer.scales")
    flip = cfg.infer.flip if opts.flip is None else opts.flip
    max_size = cfg.infer.max_size if opts.max_size is None else opts.max_size
    workers = cfg.infer.crf.workers if opts.crf_workers is None else opts.crf_workers
    batch_size = default_batch_size(cfg.infer, device) if opts.batch_size is None else opts.batch_size
    try:  # the options pass the config's range checks too (the ceilings on scales, max_size, workers, batch size)
        replace(cfg.infer, scales=scales, max_size=max_size, batch_size=batch_size,
                crf=replace(cfg.infer.crf, workers=workers))  # fmt: skip
    except ConfigError as err:  # named by the options given whose keys the error names
        given = [(option, key) for option, key, value in (
            ("--scales", "infer.scales", opts.scales), ("--max-size", "infer.max_size", opts.max_size),
            ("--crf-workers", "infer.crf.workers", opts.crf_workers),
            ("--batch-size", "infer.batch_size", opts.batch_size)) if value is not None]  # fmt: skip
        named = [option for option, key in given if f"'{key}'" in str(err)] or [option for option, _ in given]
        raise ConfigError(f"{', '.join(named)}: {err}") from None
    max_size = longest_side(max_size, scales)  # 0 (no cap of its own) still keeps the model within MAX_SIDE
    listing = list_inputs(input_path, layout, split, list_path, (cfg.data.mask_dir, "SegmentationClass"),
                          opts.follow_symlinks)  # fmt: skip
    settings = {
        "checkpoint": os.path.realpath(checkpoint),
        "input": os.path.realpath(input_path),
        "split": split,
        "list": None if list_path is None else os.path.realpath(list_path),
        "scales": list(scales),
        "flip": flip,
        "max_size": max_size,
        "mask_classes": cfg.infer.mask_classes,
        "crf": opts.crf,
        "crf_config": asdict(cfg.infer.crf) if opts.crf else None,
        "outputs": layout.kinds,
        "dtype": model_dtype(cfg.infer.dtype, device),  # compared: bf16 moves more (docs/reference.md row 23)
        # recorded, not compared: like the device, it moves a few pixels at float rounding (docs/reference.md row 21)
        "fp32_precision": fp32_products(cfg.infer.fp32_precision, device),
    }
    changed = prepare_output(layout, settings)

    part = RankPart()
    todo, part.existing, part.skipped = split_done(own_shard(listing.sources), layout, listing.inputs, opts.overwrite)
    with ExitStack() as stack:  # the CRF workers start before the model exists (see CrfPool)
        crf = CrfJobs(stack, cfg.infer.crf, opts.crf_workers, batch_size, device) if opts.crf and todo else None
        if crf is not None and crf.pool.workers:  # their CPUs are not the model's
            threads_beside(opts.num_workers + crf.pool.workers, opts.threads)
        setup = LoopSetup(
            segmenter=Segmenter.from_checkpoint(ckpt, device, cfg.infer, checkpoint), output=layout.root,
            scales=scales,
            flip=flip, max_size=max_size, logits_stride=cfg.infer.logits_stride, batch_size=batch_size,
            batch_pixels=cfg.infer.batch_pixels, num_workers=opts.num_workers, write_threads=opts.write_threads,
            progress=opts.progress, cams="cams" in layout.kinds,
        )  # fmt: skip
        loop = InferenceLoop(setup, crf)
        tic = time.perf_counter()
        try:
            loop.run(todo)
        except OutputError as err:  # a full disk: keep what is finished, say what is not
            part.failure = err
        part.seconds = time.perf_counter() - tic
    part.finished, part.left = loop.finished, len(todo) - loop.handled
    part.skipped += loop.skipped
    parts = all_gather_objects(part)
    summary = merge_parts(parts, [s.rel for s in listing.sources], listing.skipped, layout)
    failures = [p.failure for p in parts if p.failure is not None]
    left = sum(p.left for p in parts)
    if changed and summary.existing and not opts.overwrite:
        summary.notes.append(
            f"{summary.existing} images were kept from an earlier run with other settings ({', '.join(changed)}); "
            "rerun with --overwrite to redo them"
        )
    unwritten: list[str] = []
    try:  # rank 0 writes the run files; every rank leaves once they are written
        if rank_and_world()[0] == 0:
            finished = sorted({rel for p in parts for rel in (*p.existing, *p.finished)})
            unwritten = write_run_files(layout, finished, ckpt["classes"], cfg.infer.cls_thresh,
                                        listing.truth if opts.gallery else None, summary, failures, left)  # fmt: skip
    finally:
        barrier()
    if failures:
        raise stopped(failures[0], summary.done, left, unwritten)
    if single and listing.sources:
        summary.image = _image_entry(layout, listing.sources[0].rel, cfg.infer.cls_thresh)
    return summary


def _image_entry(layout: OutputLayout, rel: str, threshold: float) -> dict[str, Any] | None:
    """The ``labels/`` entry of ``rel`` with its path and ``threshold`` (:attr:`InferenceSummary.image`), or None
    when the image was skipped (no mask, or its labels unreadable)."""
    paths = layout.paths(rel, ["masks", "labels"])
    try:
        entry = json.loads(paths["labels"].read_text()) if paths["masks"].is_file() else None
    except (OSError, ValueError):
        return None
    return None if entry is None else {**entry, "path": rel, "threshold": threshold}
