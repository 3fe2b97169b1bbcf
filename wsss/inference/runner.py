"""The inference loop over an image folder or a VOC split: decoding, batching, test-time augmentation
(:mod:`wsss.models.tta`), the dense CRF pool (:mod:`wsss.inference.crf`) and the outputs.

:func:`run_inference` is what ``tools/infer.py`` calls; every batch goes through
:meth:`wsss.inference.predictor.Segmenter.predict`, the predictor a Python user calls. Output layout
under OUTPUT, mirroring each image's path relative to INPUT (a folder, recursive) or to ``INPUT/JPEGImages``
(a VOC root with a split)::

    masks/<rel>.png       palette PNG (VOC palette), values = class indices in [0, C); with
                          infer.mask_classes = "present" (default) only background and the present classes
    overlays/<rel>.jpg    mask blended over the image (--overlay)
    cams/<rel>.jpg        CAM heatmap over the image (--cams): max over the present classes
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
    labels/<rel>.json     "present": the classes the classifier predicts present (sigmoid > infer.cls_thresh),
                          or its top-1 class when none is ("top1_fallback": true); "scores": every
                          foreground class's probability (written with the image's other outputs, so an
                          interrupted run loses none)
    image_labels.json     every image's labels/ entry in one file, merged at the end of each run
    run.json              the settings of the last run; summary.json: what it did

``<rel>`` is the input's relative path with its extension replaced. Every file is written atomically; the
temporaries a killed run left behind are removed at the start of the next.
An image whose requested outputs all exist is skipped (not even decoded) unless ``overwrite``.

Batching (:mod:`wsss.inference.batching`): a batch holds images of one size. Each scale of a batch of
``n`` images is one forward pass of ``2n`` (with flip). Results are identical to ``batch_size=1`` up to
float rounding.

Dense CRF (``crf=True``): softmax of the TTA logits of the classes the mask may hold, then
:func:`wsss.inference.crf.crf_labels` in a pool of
``CrfConfig.workers`` processes; a job is submitted as soon as an image's logits exist and its mask is
written when the job finishes, so the model loop does not wait for the CRF (it waits only when more than
``2 * workers + batch_size`` jobs are queued, to bound memory).

Size cap: the model sees every image with its longest side at most ``max_size`` (``infer.max_size``, default
1024; 0: no cap); every output comes back at the image's own size a band of rows of at most ``max_size**2``
pixels at a time (:class:`~wsss.inference.predictor.Prediction`), so no single op runs long on a huge image and
no full-size float map is held: a 12000 x 12000 photo costs its uint8 pixels, its mask and bands.

Interrupts: ``tools/infer.py`` turns SIGTERM into ``SystemExit`` (:func:`wsss.utils.lifetime.exit_on_sigterm`),
raised at the first Python step after the running torch op, which is between two scales, two bands or two
images: with the size cap no op takes more than seconds, so SIGTERM ends a run within seconds. Every finished
image's outputs are whole (the mask, written last, marks it finished) and a half-written file is never left in
place; a re-run finishes the rest.

A full disk: the run stops at the first output that cannot be written, still writes ``image_labels.json``, the
gallery and ``summary.json`` for the images finished (where space allows) and raises
:class:`~wsss.inference.sources.OutputError`, one line naming the file and what was kept.

Path safety (and why an output never lands on an input): see :mod:`wsss.inference.sources`.

Under ``torchrun`` (``tools/infer.py --launcher pytorch``): every rank lists the same images and drops name
collisions on the whole list; rank 0 prepares OUTPUT (stale temporaries, ``run.json``) while the others wait;
each rank then takes its share (:func:`~wsss.inference.sources.own_shard`: balanced by pixels, the same split
whatever is already written) and runs the loop above on it with its own decoders and CRF pool; the summaries and
finished images are gathered, rank 0 writes ``image_labels.json``, the gallery and ``summary.json``, and every
rank returns the merged summary after a last barrier. A rank with no share still joins every collective. A killed
rank ends the job through torchrun; its finished images are whole, and any re-run (any number of ranks) skips them.
"""

from __future__ import annotations

import functools
import io
import json
import math
import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader
from tqdm import tqdm

from wsss.config import apply_options
from wsss.data.classes import voc_palette
from wsss.data.folder import Skipped
from wsss.inference.batching import ImageList, SizeBuckets, identity
from wsss.inference.crf import CrfPool
from wsss.inference.gallery import class_cam_paths, find_ground_truth, present_indices, write_class_cams, write_gallery
from wsss.inference.predictor import Prediction, Segmenter
from wsss.inference.sources import (
    FULL_DISK,
    OutputError,
    Source,
    check_output_folder,
    input_files,
    inside,
    list_file,
    list_folder,
    list_split,
    output_paths,
    overwritten_input,
    own_shard,
    writing,
)
from wsss.inference.visualize import cam_overlay, mask_overlay, thumbnail
from wsss.model_file import config_from_checkpoint, read_model_file
from wsss.models.tta import predicted_classes
from wsss.utils.distributed import all_gather_objects, barrier, rank_and_world
from wsss.utils.fileio import atomic_write_bytes, atomic_write_text, remove_stale_temporaries, save_image, save_mask
from wsss.utils.lifetime import die_with_parent

THUMB_SIZE = 256

__all__ = [
    "InferenceOptions", "InferenceSummary", "LoopSetup", "check_scales", "default_output", "run_inference",
]  # fmt: skip


def _cam_overlay(pred: Prediction, i: int, classes: Tensor, raw: np.ndarray) -> np.ndarray:
    """The heatmap of the max over ``classes``' full-size CAMs of image ``i``, blended over ``raw``, a band of rows
    at a time."""
    out = np.empty_like(raw)
    for start, band in pred.cams(i, classes):
        out[start : start + band.shape[-2]] = cam_overlay(raw[start : start + band.shape[-2]], band.cpu().numpy())
    return out


# ---------------------------------------------------------------------------------------------------------
# The loop


@dataclass
class InferenceOptions:
    """What :func:`run_inference` computes and writes.

    Attributes:
        scales: TTA scales; None takes ``infer.scales`` of the checkpoint's config.
        flip: Horizontal-flip TTA; None takes ``infer.flip`` of the checkpoint's config.
        crf: Refine the masks with the dense CRF (constants: the checkpoint's ``infer.crf``).
        overlay: Write mask overlays. cams: write CAM heatmaps. logits: write 1/4-size float16 logits.
        gallery: Write thumbnails and ``index.html`` (implies overlay and cams).
        batch_size: Images per forward batch (same-size images only).
        overwrite: Redo images whose outputs exist.
        num_workers: Image decoding processes (0: in the main process).
        crf_workers: CRF processes; None takes ``infer.crf.workers`` (0: serial).
        max_size: Longest side the model sees (0: no cap); None takes ``infer.max_size`` (see :class:`Segmenter`).
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
    batch_size: int = 1
    overwrite: bool = False
    num_workers: int = 2
    crf_workers: int | None = None
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
                  ("--workers", self.num_workers, 0, ""), ("--crf-workers", self.crf_workers, 0, ""))  # fmt: skip
        for option, value, low, note in bounds:
            if value is not None and value < low:
                raise ValueError(f"{option}: must be >= {low}{note}, got {value}")

    def kinds(self) -> list[str]:
        """Output kinds this run writes for every image."""
        kinds = ["masks", "labels"]
        kinds += ["overlays"] if self.overlay or self.gallery else []
        kinds += ["cams"] if self.cams or self.gallery else []
        kinds += ["logits"] if self.logits else []
        kinds += ["thumbs"] if self.gallery else []
        return kinds


@dataclass
class InferenceSummary:
    """What a run did.

    Attributes:
        output: The output folder.
        done: Images predicted in this run.
        existing: Images skipped because their outputs exist.
        skipped: Files not processed, with the reason (corrupt, unsafe path, not an image, ...).
        seconds: Wall time of the loop (model loading and listing excluded).
        notes: Warnings for the user.
        error: Why the run stopped early (an output that could not be written), else None.
    """

    output: Path
    done: int = 0
    existing: int = 0
    skipped: list[Skipped] = field(default_factory=list)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def images_per_s(self) -> float:
        return self.done / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        out = {
            "output": str(self.output),
            "done": self.done,
            "existing": self.existing,
            "seconds": round(self.seconds, 3),
            "images_per_s": round(self.images_per_s, 3),
            "skipped": [asdict(s) for s in self.skipped],
            "notes": self.notes,
        }
        return out if self.error is None else {**out, "error": self.error}

    def format(self, max_lines: int = 20) -> str:
        """Human-readable summary (at most ``max_lines`` skipped files listed)."""
        lines = [
            f"done {self.done} images in {self.seconds:.1f} s ({self.images_per_s:.2f} images/s); "
            f"{self.existing} already done (outputs exist; --overwrite redoes them); "
            f"{len(self.skipped)} skipped"
        ]
        lines += [f"  skipped {s.path}: {s.reason}" for s in self.skipped[:max_lines]]
        if len(self.skipped) > max_lines:
            lines.append(f"  ... and {len(self.skipped) - max_lines} more, see {self.output / 'summary.json'}")
        lines += [f"note: {n}" for n in self.notes]
        lines.append(f"outputs in {self.output}")
        return "\n".join(lines)


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
            (:func:`~wsss.inference.sources.list_file`).

    Returns:
        The :class:`InferenceSummary` (also written to ``output/summary.json``).

    Raises:
        FileNotFoundError: The checkpoint, the input folder or the split is missing.
        ValueError: An option out of range, an OUTPUT where an output could land on an input
            (:func:`~wsss.inference.sources.check_output_folder`), or the checkpoint is not a wsss checkpoint.
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
    folder = input_path.parent if single else input_path
    output = Path(output) if output is not None else default_output(input_path)
    check_output_folder(folder, output)

    ckpt = read_model_file(checkpoint)
    cfg = apply_options(config_from_checkpoint(ckpt), opts.cfg_options, prefix="infer.")
    scales = tuple(cfg.infer.scales if opts.scales is None else opts.scales)
    check_scales(scales, "--scales" if opts.scales is not None else "infer.scales")
    flip = cfg.infer.flip if opts.flip is None else opts.flip
    max_size = cfg.infer.max_size if opts.max_size is None else opts.max_size
    mask_dirs = (cfg.data.mask_dir, "SegmentationClass")
    truth = {}
    if split is not None:
        sources, skipped = list_split(input_path, split, opts.follow_symlinks)
        truth = find_ground_truth(input_path, mask_dirs, [s.rel for s in sources])
    elif list_path is not None:
        sources, skipped = list_file(input_path, list_path, opts.follow_symlinks)
    elif single:
        sources, skipped = [Source(input_path.name, input_path)], []
    else:
        sources, skipped = list_folder(input_path, exclude=output, follow_symlinks=opts.follow_symlinks)
    inputs = input_files([*(s.path for s in sources), *truth.values()])
    kinds = opts.kinds()
    sources, collisions = _claim(sources, output, kinds)
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
    }
    rank, _ = rank_and_world()
    changed: list[str] = []
    try:  # rank 0 prepares OUTPUT; the others write nothing before it is done
        if rank == 0:
            with writing(output):
                output.mkdir(parents=True, exist_ok=True)
            remove_stale_temporaries(output, recursive=True)  # of killed runs; a live run's are kept
            changed = _changed_settings(output, settings)
            _save(output / "run.json", atomic_write_text, json.dumps({**settings, "outputs": kinds}, indent=2) + "\n")
    finally:
        barrier()

    summary = InferenceSummary(output=output)
    todo, finished = _plan(own_shard(sources), output, kinds, opts.overwrite, summary, inputs)
    failures: list[OutputError] = []
    handled = 0
    with ExitStack() as stack:
        pool = None
        if opts.crf and todo:  # workers start before the model exists (see CrfPool)
            pool = stack.enter_context(CrfPool(cfg.infer.crf, opts.crf_workers))
        setup = LoopSetup(
            segmenter=Segmenter.from_checkpoint(ckpt, device, cfg.infer, checkpoint), kinds=kinds, scales=scales,
            flip=flip, max_size=max_size, logits_stride=cfg.infer.logits_stride, batch_size=opts.batch_size,
            num_workers=opts.num_workers, progress=opts.progress,
        )  # fmt: skip
        loop = _InferenceLoop(setup, summary, pool)
        tic = time.perf_counter()
        try:
            loop.run(todo)
        except OutputError as err:  # a full disk: keep what is finished, say what is not
            failures.append(err)
        summary.seconds = time.perf_counter() - tic
        handled = loop.handled
    finished += loop.finished
    parts = all_gather_objects((summary, finished, failures, len(todo) - handled, changed))
    summary = _merged([part[0] for part in parts], output, skipped + collisions)
    finished = sorted({rel for part in parts for rel in part[1]})
    failures = [err for part in parts for err in part[2]]
    left = sum(part[3] for part in parts)
    changed = parts[0][4]
    if changed and summary.existing and not opts.overwrite:
        summary.notes.append(
            f"{summary.existing} images were kept from an earlier run with other settings ({', '.join(changed)}); "
            "rerun with --overwrite to redo them"
        )
    unwritten: list[str] = []
    try:  # rank 0 merges the run files; every rank leaves once they are written
        if rank == 0:
            _write_run_files(output, finished, ckpt["classes"], cfg.infer.cls_thresh, truth if opts.gallery else None,
                             summary, failures, unwritten, left)  # fmt: skip
    finally:
        barrier()
    if failures:
        raise _stopped(failures[0], summary.done, left, unwritten)
    return summary


def _claim(sources: list[Source], output: Path, kinds: list[str]) -> tuple[list[Source], list[Skipped]]:
    """Sources whose outputs no earlier source takes (``a.jpg`` and ``a.png`` both write ``masks/a.png``), and the
    others skipped; decided on the whole list before it is shared out, so no two ranks write one file."""
    kept, skipped, claimed = [], [], {}
    for src in sources:
        key = output_paths(output, src.rel, ["masks"])["masks"].as_posix()
        if key in claimed:
            skipped.append(Skipped(src.rel, f"its outputs would overwrite those of {claimed[key]}"))
        else:
            claimed[key] = src.rel
            kept.append(src)
    return kept, skipped


def _merged(parts: list[InferenceSummary], output: Path, listed: list[Skipped]) -> InferenceSummary:
    """One summary of every rank's: counts summed, the slowest rank's time, the files skipped when listing (the same
    on every rank) and by each rank, sorted by path."""
    skipped = sorted([*listed, *(s for part in parts for s in part.skipped)], key=lambda s: s.path)
    return InferenceSummary(
        output=output,
        done=sum(part.done for part in parts),
        existing=sum(part.existing for part in parts),
        skipped=skipped,
        seconds=max(part.seconds for part in parts),
        notes=[note for part in parts for note in part.notes],
    )


def _write_run_files(
    output: Path,
    finished: list[str],
    classes: list[str],
    threshold: float,
    truth: dict[str, Path] | None,
    summary: InferenceSummary,
    failures: list[OutputError],
    unwritten: list[str],
    left: int,
) -> None:
    """``image_labels.json``, the gallery (``truth`` not None: the ground truth of each image that has one) and
    ``summary.json`` of the finished images; a file that cannot be written adds its error to ``failures`` and its
    name to ``unwritten``."""
    try:
        labels = _update_labels_file(output, finished, classes, threshold)
    except OutputError as err:
        failures.append(err)
        unwritten.append("image_labels.json")
        labels = {}
    if truth is not None:
        missing = {rel: _missing_for_gallery(output, rel, labels, classes) for rel in finished}
        shown = [rel for rel, lost in missing.items() if lost is None]
        left_out = [lost for lost in missing.values() if lost is not None]
        if left_out:
            n = len(left_out)
            summary.notes.append(
                f"{n} finished image{'s' * (n != 1)} {'is' if n == 1 else 'are'} left out of index.html: gallery "
                f"files are missing (such as {left_out[0]}); --overwrite redoes them"
            )
        try:
            write_gallery(output, shown, labels, threshold, classes, {rel: truth[rel] for rel in shown if rel in truth})
        except OutputError as err:
            failures.append(err)
            unwritten.append("index.html")
    if failures:
        summary.error = str(_stopped(failures[0], summary.done, left, unwritten))
    try:
        _save(output / "summary.json", atomic_write_text, json.dumps(summary.to_dict(), indent=2) + "\n")
    except OutputError as err:
        failures.append(err)
        unwritten.append("summary.json")


def _stopped(failure: OutputError, done: int, left: int, unwritten: list[str]) -> OutputError:
    """``failure`` (the first output that could not be written) with what the run kept: ``done`` images finished,
    ``left`` not, the run files ``unwritten``."""
    fix = "free space" if failure.error.errno in FULL_DISK else "fix that"
    lost = f"; not written: {', '.join(unwritten)}" if unwritten else ""
    return OutputError(
        failure.path,
        failure.error,
        f"stopped with {done} image{'s' * (done != 1)} finished in this run (outputs complete), {left} not "
        f"finished{lost}; {fix} and run again: finished images are skipped",
    )


def _save(path: Path, save: Callable[..., None], *args: Any) -> None:
    """``save(path, *args)``, an OSError raised as :class:`OutputError` naming ``path``."""
    with writing(path):
        save(path, *args)


def _missing_for_gallery(output: Path, rel: str, labels: dict[str, dict], classes: list[str]) -> Path | None:
    """The first file that the gallery row of ``rel`` needs and a run writes that is missing (its labels entry, its
    thumbnail, overlay, CAM, mask and the CAM thumbnail of each present class), or None."""
    if rel not in labels:
        return output_paths(output, rel, ("labels",))["labels"]
    paths = output_paths(output, rel, ("thumbs", "overlays", "cams", "masks")).values()
    cams = class_cam_paths(output, rel, present_indices(labels[rel], classes)).values()
    return next((p for p in (*paths, *cams) if not p.is_file()), None)


def _plan(
    sources: list[Source],
    output: Path,
    kinds: list[str],
    overwrite: bool,
    summary: InferenceSummary,
    inputs: dict[tuple[int, int], Path],
) -> tuple[list[tuple[Source, dict[str, Path]]], list[str]]:
    """Split sources into those to run and those already done; skip unsafe outputs (outside OUTPUT, or one of the
    ``inputs`` files of :func:`~wsss.inference.sources.input_files`)."""
    todo, done = [], []
    for src in sources:
        paths = output_paths(output, src.rel, kinds)
        gallery = output_paths(output, src.rel, ["gt", "mask_thumbs", "class_cams"]) if "thumbs" in kinds else {}
        written = [*paths.values(), *gallery.values()]
        escaped = [p for p in written if not inside(p, output)]
        if escaped:
            reason = f"output {escaped[0]} resolves outside the output folder ({os.path.realpath(escaped[0])})"
            summary.skipped.append(Skipped(src.rel, reason))
            continue
        clash = next(((p, f) for p in written if (f := overwritten_input(p, inputs)) is not None), None)
        if clash is not None:
            reason = f"its output {clash[0]} is the input file {clash[1]}; an output never overwrites an input"
            summary.skipped.append(Skipped(src.rel, reason))
            continue
        if not overwrite and all(p.is_file() for p in paths.values()):
            summary.existing += 1
            done.append(src.rel)
        else:
            todo.append((src, paths))
    return todo, done


def _changed_settings(output: Path, settings: dict) -> list[str]:
    """The settings that differ from those of the earlier run in ``output`` (its ``run.json``)."""
    try:
        previous = json.loads((output / "run.json").read_text())
    except (OSError, ValueError):
        return []
    keys = ("checkpoint", "scales", "flip", "max_size", "mask_classes", "crf", "crf_config")
    return [k for k in keys if previous.get(k) != settings[k]]


def _update_labels_file(output: Path, finished: list[str], classes: list[str], threshold: float) -> dict[str, dict]:
    """Merge the ``labels/`` entries of the finished images made for ``classes`` into ``output/image_labels.json``;
    return them."""
    images: dict[str, dict] = {}
    for rel in finished:
        try:
            entry = json.loads(output_paths(output, rel, ["labels"])["labels"].read_text())
        except (OSError, ValueError):
            continue
        if isinstance(entry, dict) and entry.pop("classes", None) == list(classes):
            images[rel] = entry
    path = output / "image_labels.json"
    payload = {"classes": list(classes), "threshold": threshold, "images": dict(sorted(images.items()))}
    _save(path, atomic_write_text, json.dumps(payload, indent=1) + "\n")
    return images


def _save_npy(path: Path, array: np.ndarray) -> None:
    buf = io.BytesIO()
    np.save(buf, array)
    atomic_write_bytes(path, buf.getvalue())


@dataclass
class LoopSetup:
    """What the inference loop needs besides the images, as :func:`run_inference` resolved it.

    Attributes:
        segmenter: The model with its classes, normalisation and class threshold.
        kinds: Output kinds written per image (:meth:`InferenceOptions.kinds`).
        scales: TTA scales.
        flip: Flip TTA.
        max_size: Longest side the model sees (0: the original size).
        logits_stride: Downscaling of the saved logits.
        batch_size: Images per forward batch.
        num_workers: Decoding processes.
        progress: Show a progress bar.
    """

    segmenter: Segmenter
    kinds: list[str]
    scales: tuple[float, ...]
    flip: bool
    max_size: int
    logits_stride: int
    batch_size: int
    num_workers: int
    progress: bool


class _InferenceLoop:
    """State of one :func:`run_inference` loop: decoding, batching, model, CRF jobs, writing."""

    def __init__(self, setup: LoopSetup, summary: InferenceSummary, pool: CrfPool | None) -> None:
        self.setup, self.summary, self.pool = setup, summary, pool
        self.palette = voc_palette()
        self.pending: deque[tuple[Source, dict[str, Path], np.ndarray, np.ndarray, Future]] = deque()
        self.finished: list[str] = []
        self.handled = 0
        """Images finished or skipped so far."""
        self.bar = None

    def run(self, todo: list[tuple[Source, dict[str, Path]]]) -> None:
        loader = DataLoader(
            ImageList([src for src, _ in todo]),
            batch_size=None,
            num_workers=self.setup.num_workers if len(todo) > 1 else 0,
            collate_fn=identity,
            worker_init_fn=functools.partial(die_with_parent, os.getpid()),
        )
        buckets = SizeBuckets(self.setup.batch_size)
        self.bar = tqdm(total=len(todo), desc="infer", unit="img", dynamic_ncols=True, disable=not self.setup.progress)
        try:
            for item in loader:
                src, paths = todo[item["index"]]
                if item["image"] is None:
                    self.summary.skipped.append(Skipped(src.rel, f"unreadable image ({item['error']})"))
                    self._advance()
                    continue
                for batch in buckets.add((src, paths, item["image"]), item["image"].shape):
                    self._run_batch(batch)
            for batch in buckets.flush():
                self._run_batch(batch)
            self._collect(block=True)
        finally:
            self.bar.close()

    def _advance(self) -> None:
        self.handled += 1
        self.bar.update(1)

    def _run_batch(self, batch: list[tuple[Source, dict[str, Path], np.ndarray]]) -> None:
        setup, segmenter = self.setup, self.setup.segmenter
        images = [raw for _, _, raw in batch]
        pred = segmenter.predict(images, setup.scales, setup.flip, setup.max_size, cams="cams" in setup.kinds)
        names = segmenter.classes[1:]
        for i, (src, paths, raw) in enumerate(batch):
            cls_logits = pred.out.cls_logits[i]
            present, top1 = predicted_classes(cls_logits, segmenter.cfg.cls_thresh)
            entry = {
                "classes": segmenter.classes,
                "present": [n for n, p in zip(names, present.tolist(), strict=True) if p],
                "top1_fallback": top1,
                "scores": {n: round(p, 4) for n, p in zip(names, cls_logits.sigmoid().tolist(), strict=True)},
            }
            _save(paths["labels"], atomic_write_text, json.dumps(entry) + "\n")  # before the mask, which marks it done
            if "logits" in paths:
                _save(paths["logits"], _save_npy, pred.small_logits(i, setup.logits_stride))
            if "cams" in paths:
                _save(paths["cams"], save_image, _cam_overlay(pred, i, present, raw))
            if "thumbs" in paths:  # the thumbnail last: it marks the image's CAM thumbnails complete
                thumb = thumbnail(raw, THUMB_SIZE)
                shown = present.nonzero()[:, 0]
                cams = pred.out.cam[i, shown.to(pred.out.cam.device)]
                write_class_cams(self.summary.output, src.rel, thumb, cams, (shown + 1).tolist())
                _save(paths["thumbs"], save_image, thumb)
            keep = segmenter.mask_classes(cls_logits)
            if self.pool is not None:
                job = self.pool.submit(raw, pred.probabilities(i, keep))
                self.pending.append((src, paths, raw, keep.nonzero()[:, 0].to(torch.uint8).cpu().numpy(), job))
            else:
                self._finish(src, paths, raw, pred.mask(i, keep))
        self._collect(block=False)

    def _collect(self, block: bool) -> None:
        """Write the masks of finished CRF jobs (in submission order); with ``block``, wait for all. Also
        waits for the oldest job while more than ``2 * workers + batch_size`` are queued."""
        limit = 0 if block else 2 * (self.pool.workers if self.pool else 0) + self.setup.batch_size
        while self.pending and (self.pending[0][-1].done() or len(self.pending) > limit):
            src, paths, raw, index, future = self.pending.popleft()
            try:
                mask = index[future.result()]  # the CRF's labels index the classes it was given
            except Exception as err:  # a failed CRF job skips its image, the run goes on
                self.summary.skipped.append(Skipped(src.rel, f"dense CRF failed ({type(err).__name__}: {err})"))
                self._advance()
                continue
            self._finish(src, paths, raw, mask)

    def _finish(self, src: Source, paths: dict[str, Path], raw: np.ndarray, mask: np.ndarray) -> None:
        if "overlays" in paths:
            _save(paths["overlays"], save_image, mask_overlay(raw, mask))
        _save(paths["masks"], save_mask, mask, self.palette)
        self.finished.append(src.rel)
        self.summary.done += 1
        self._advance()
