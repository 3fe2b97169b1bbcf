"""The inference loop of one rank (:func:`wsss.inference.folder.runner.run_inference`): decoding, batching, the model,
the dense CRF jobs, and the outputs of each image.

Batching (:mod:`wsss.inference.folder.batching`): a batch holds images of one size. Each scale of a batch of ``n``
images
is one forward pass of ``2n`` (with flip). Results are identical to ``batch_size=1`` up to float rounding.

Each image's files are written in an order that makes the mask the mark of a finished image: its logits, then,
once its mask exists (the ``present`` classes are those of the classifier that the mask shows,
:meth:`~wsss.inference.predictor.Segmenter.present_classes`), its ``labels/`` entry, CAM overlay, CAM thumbnails
and thumbnail, then its overlay and last its mask. With the dense CRF (:class:`CrfJobs`) the images of a model batch
are submitted together as soon as their probabilities exist: the ``torch`` backend runs them in one call on the
model's device (the probabilities never leave it); the ``pydensecrf`` backend queues them to its worker processes and
an image's files are written when its job finishes, so the model loop does not wait for the CRF (a queued image
keeps its batch's model outputs, at the model's resolution, until then).
"""

from __future__ import annotations

import functools
import io
import json
import os
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader
from tqdm import tqdm

from wsss.config import CrfConfig
from wsss.data.classes import voc_palette
from wsss.data.folder import Skipped
from wsss.inference.crf import CrfPool
from wsss.inference.folder.batching import ImageList, SizeBuckets, identity
from wsss.inference.folder.gallery import write_class_cams
from wsss.inference.folder.sources import Source, save_output
from wsss.inference.folder.visualize import cam_legend, cam_overlay, cam_peaks, draw_cam_legend, mask_overlay, thumbnail
from wsss.inference.predictor import BatchOutputs, Segmenter
from wsss.utils.fileio import atomic_write_bytes, atomic_write_text, save_image, save_mask
from wsss.utils.lifetime import die_with_parent

THUMB_SIZE = 256

__all__ = ["THUMB_SIZE", "CrfJobs", "InferenceLoop", "LoopSetup"]

Item = tuple[Source, dict[str, Path], np.ndarray]
"""An image of the loop: its source, its output paths, its (H, W, 3) uint8 pixels."""


# ---------------------------------------------------------------------------------------------------------
# The dense CRF: the one place the loop uses wsss.inference.crf


class CrfJobs:
    """Dense CRF jobs in flight, collected in submission order.

    Args:
        stack: Holds the :class:`~wsss.inference.crf.CrfPool` (shut down when it closes). Make this before the
            model: the workers start from a small process.
        cfg: The CRF's constants (``infer.crf``).
        workers: CRF processes; None takes ``cfg.workers``.
        batch_size: Images per forward batch: up to ``2 * workers + batch_size`` jobs are queued before
            :meth:`ready` waits for the oldest (bounds memory).
    """

    def __init__(self, stack: ExitStack, cfg: CrfConfig, workers: int | None, batch_size: int) -> None:
        self.pool = stack.enter_context(CrfPool(cfg, workers))
        self.limit = 2 * self.pool.workers + batch_size
        self.pending: deque[tuple[Any, Future]] = deque()
        self.on_device = cfg.backend == "torch"
        """The probabilities stay where the model left them (the torch backend runs there)."""

    def submit(self, jobs: list[tuple[Any, np.ndarray, np.ndarray | Tensor]]) -> None:
        """Queue images ``(key, raw, probs)``: ``raw`` (H, W, 3) uint8 and ``probs`` (K, H, W) float32 class
        probabilities (a tensor on the model's device when :attr:`on_device`), one batch."""
        futures = self.pool.submit_batch([raw for _, raw, _ in jobs], [probs for _, _, probs in jobs])
        self.pending.extend((key, future) for (key, _, _), future in zip(jobs, futures, strict=True))

    def ready(self, block: bool) -> Iterator[tuple[Any, np.ndarray | Exception]]:
        """``(key, labels)`` of the finished jobs, oldest first: (H, W) indices into the K classes submitted, or the
        exception of a failed job. With ``block`` every job; else the finished ones and the oldest while more than
        the limit are queued."""
        limit = 0 if block else self.limit
        while self.pending and (self.pending[0][1].done() or len(self.pending) > limit):
            key, future = self.pending.popleft()
            try:
                labels = future.result()
            except Exception as err:  # a failed job skips its image, the run goes on
                yield key, err
                continue
            yield key, labels


# ---------------------------------------------------------------------------------------------------------
# The loop


@dataclass
class LoopSetup:
    """What the inference loop needs besides the images, as :func:`~wsss.inference.folder.runner.run_inference` resolved
    it.

    Attributes:
        segmenter: The model with its classes, normalisation and class threshold.
        output: The output folder.
        scales: TTA scales.
        flip: Flip TTA.
        max_size: Longest side the model sees (0: the original size).
        logits_stride: Downscaling of the saved logits.
        batch_size: Images per forward batch.
        num_workers: Decoding processes.
        progress: Show a progress bar.
        cams: Compute CAMs (CAM overlays or the gallery).
    """

    segmenter: Segmenter
    output: Path
    scales: tuple[float, ...]
    flip: bool
    max_size: int
    logits_stride: int
    batch_size: int
    num_workers: int
    progress: bool
    cams: bool


class InferenceLoop:
    """One rank's loop over its images: what it finished and skipped.

    Attributes:
        finished: Relative paths of the images whose outputs were all written, in order.
        skipped: Images not finished (unreadable, a failed CRF job), with the reason.
        handled: Images finished or skipped so far.
    """

    def __init__(self, setup: LoopSetup, crf: CrfJobs | None) -> None:
        self.setup, self.crf = setup, crf
        self.palette = voc_palette()
        self.finished: list[str] = []
        self.skipped: list[Skipped] = []
        self.handled = 0
        self.bar: Any = None

    def run(self, todo: list[tuple[Source, dict[str, Path]]]) -> None:
        """Predict and write every image of ``todo`` (its source and output paths)."""
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
                    self._skip(src, item["error"])  # read_image's reason: "not a readable image (...)"
                    continue
                for batch in buckets.add((src, paths, item["image"]), item["image"].shape):
                    self._run_batch(batch)
            for batch in buckets.flush():
                self._run_batch(batch)
            self._collect(block=True)
        finally:
            self.bar.close()

    def _skip(self, src: Source, reason: str) -> None:
        self.skipped.append(Skipped(src.rel, reason))
        self._advance()

    def _advance(self) -> None:
        self.handled += 1
        self.bar.update(1)

    def _run_batch(self, batch: list[Item]) -> None:
        setup, segmenter = self.setup, self.setup.segmenter
        images = [raw for _, _, raw in batch]
        pred = segmenter.run_batch(images, setup.scales, setup.flip, setup.max_size, cams=setup.cams)
        jobs = []
        for i, (src, paths, raw) in enumerate(batch):
            if "logits" in paths:
                save_output(paths["logits"], _save_npy, pred.small_logits(i, self.setup.logits_stride))
            keep = segmenter.mask_classes(pred.out.cls_logits[i])
            if self.crf is not None:
                index = keep.nonzero()[:, 0].to(torch.uint8).cpu().numpy()
                jobs.append(((pred, i, src, paths, raw, index), raw, pred.probabilities(i, keep, self.crf.on_device)))
            else:
                self._finish(pred, i, src, paths, raw, pred.mask(i, keep))
        if jobs:
            self.crf.submit(jobs)
        self._collect(block=False)

    def _collect(self, block: bool) -> None:
        """Write the files of the images whose CRF jobs finished (see :meth:`CrfJobs.ready`)."""
        if self.crf is None:
            return
        for (pred, i, src, paths, raw, index), labels in self.crf.ready(block):
            if isinstance(labels, Exception):
                self._skip(src, f"dense CRF failed ({type(labels).__name__}: {labels})")
            else:
                self._finish(pred, i, src, paths, raw, index[labels])  # the CRF's labels index the classes it got

    def _finish(
        self, pred: BatchOutputs, i: int, src: Source, paths: dict[str, Path], raw: np.ndarray, mask: np.ndarray
    ) -> None:
        """Write the files of image ``i`` of ``pred`` that follow its ``mask``, and last the mask."""
        segmenter, cls_logits = self.setup.segmenter, pred.out.cls_logits[i]
        names = segmenter.classes[1:]
        present, top1 = segmenter.present_classes(cls_logits, mask)
        entry = {
            "classes": segmenter.classes,
            "present": [n for n, p in zip(names, present.tolist(), strict=True) if p],
            "top1_fallback": top1,
            "scores": {n: round(p, 4) for n, p in zip(names, cls_logits.sigmoid().tolist(), strict=True)},
        }
        save_output(paths["labels"], atomic_write_text, json.dumps(entry) + "\n")  # before the mask: it marks it done
        if "cams" in paths:
            save_output(paths["cams"], save_image, _cam_picture(pred, i, present, raw, segmenter.classes))
        if "thumbs" in paths:  # the thumbnail last: it marks the image's CAM thumbnails complete
            thumb = thumbnail(raw, THUMB_SIZE)
            shown = present.nonzero()[:, 0]
            cams = pred.out.cam[i, shown.to(pred.out.cam.device)]
            write_class_cams(self.setup.output, src.rel, thumb, cams, (shown + 1).tolist())
            save_output(paths["thumbs"], save_image, thumb)
        if "overlays" in paths:
            save_output(paths["overlays"], save_image, mask_overlay(raw, mask))
        save_output(paths["masks"], save_mask, mask, self.palette)
        self.finished.append(src.rel)
        self._advance()


def _cam_picture(pred: BatchOutputs, i: int, present: Tensor, raw: np.ndarray, classes: list[str]) -> np.ndarray:
    """The full-size CAM picture of image ``i``: the heatmap of the max over the ``present`` classes' CAMs blended
    over ``raw`` (a band of rows at a time), under a band naming those classes with their scores and showing the
    colour scale, each class named at its CAM's peak (:func:`~wsss.inference.folder.visualize.cam_legend`)."""
    shown = present.nonzero()[:, 0].tolist()
    height, width = raw.shape[:2]
    peaks = cam_peaks(pred.out.cam[i, present.to(pred.out.cam.device)], (height, width))
    scores = pred.out.cls_logits[i].float().sigmoid()[present.to(pred.out.cls_logits.device)].tolist()
    legend = cam_legend(width, [classes[k + 1] for k in shown], scores, peaks, [k + 1 for k in shown])
    out = np.empty((legend.height + height, width, 3), np.uint8)
    for start, band in pred.cams(i, present):
        rows = slice(legend.height + start, legend.height + start + band.shape[-2])
        out[rows] = cam_overlay(raw[start : start + band.shape[-2]], band.cpu().numpy())
    draw_cam_legend(out, legend)
    return out


def _save_npy(path: Path, array: np.ndarray) -> None:
    buf = io.BytesIO()
    np.save(buf, array)
    atomic_write_bytes(path, buf.getvalue())
