"""The inference loop of one rank (:func:`wsss.inference.folder.runner.run_inference`): decoding, batching, the model,
the dense CRF jobs, and the outputs of each image.

Batching (:mod:`wsss.inference.folder.batching`): a batch holds images of one size. Each scale of a batch of ``n``
images is one forward pass of ``2n`` (with flip). Results are identical to ``batch_size=1`` up to float rounding.

Each image's files are written, once its mask exists, in an order that makes the mask the mark of a finished image:
its logits, its ``labels/`` entry (the ``present`` classes are those of the classifier that the mask shows,
:meth:`~wsss.inference.predictor.Segmenter.present_classes`), CAM overlay, CAM thumbnails
and thumbnail, then its overlay and last its mask. With the dense CRF (:class:`CrfJobs`) the images of a model batch
are submitted together as soon as their probabilities exist: the ``torch`` backend runs them in one call on the
model's device (the probabilities never leave it); the ``pydensecrf`` backend queues them to its worker processes and
an image's files are written when its job finishes, so the model loop does not wait for the CRF (a queued image
keeps only host data until then: its pixels, probabilities, classifier logits and its classifier's classes' CAMs).

The files are encoded and written by :class:`FileWriters`' threads, in the order above within each image, while the
main thread goes on with the next batch (PNG encoding and fsync release the GIL); they make the CAM pictures too, from
the batch's CAMs copied to the host once (:meth:`~wsss.inference.predictor.BatchOutputs.host_cams`), so the main
thread reads nothing of the device per image. A write that fails (a full disk) stops the writers: no image
queued after it starts, the images being written beside it (``write_threads`` - 1 at most) finish.
"""

from __future__ import annotations

import functools
import io
import json
import os
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
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
from wsss.inference.folder.visualize import (
    cam_legend,
    cam_overlay,
    cam_peaks,
    cam_thumbnails,
    draw_cam_legend,
    mask_overlay,
    thumbnail,
)
from wsss.inference.predictor import ImageCams, Segmenter
from wsss.utils.fileio import atomic_write_bytes, atomic_write_text, save_image, save_mask
from wsss.utils.lifetime import die_with_parent

THUMB_SIZE = 256

__all__ = ["THUMB_SIZE", "CrfJobs", "FileWriters", "InferenceLoop", "LoopSetup"]

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
        device: The model's: on the CPU the jobs of either backend go to the workers (:class:`CrfPool`).
    """

    def __init__(
        self, stack: ExitStack, cfg: CrfConfig, workers: int | None, batch_size: int, device: str | torch.device
    ) -> None:
        self.pool = stack.enter_context(CrfPool(cfg, workers, device=device))
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


class FileWriters:
    """Images' files written by threads, finished in submission order.

    Args:
        threads: Writing threads; 0 writes in the calling thread, at :meth:`submit`.
        limit: Images queued before :meth:`finished` waits for the oldest (bounds the memory their pictures hold).
    """

    def __init__(self, threads: int, limit: int) -> None:
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="wsss-write") if threads else None
        self.limit = limit
        self.pending: deque[tuple[Any, Future]] = deque()
        self.failed = False
        """A write failed: the images queued after it are not written."""

    def submit(self, key: Any, writes: list[Callable[[], None]]) -> None:
        """Queue an image's ``writes``, to be run in their order."""
        if self.pool is None:
            future: Future = Future()
            try:
                self._run(writes)
                future.set_result(None)
            except BaseException as err:  # delivered through the future, as the pool would
                future.set_exception(err)
        else:
            future = self.pool.submit(self._run, writes)
        self.pending.append((key, future))

    def _run(self, writes: list[Callable[[], None]]) -> None:
        if self.failed:
            raise _NotWritten
        try:
            for write in writes:
                write()
        except BaseException:
            self.failed = True
            raise

    def finished(self, block: bool) -> Iterator[Any]:
        """The keys of the images written, oldest first: with ``block`` every queued one, else the finished ones and
        the oldest while more than the limit are queued. A failed write raises its error (an
        :class:`~wsss.inference.folder.sources.OutputError`)."""
        limit = 0 if block else self.limit
        while self.pending and (self.pending[0][1].done() or len(self.pending) > limit):
            key, future = self.pending.popleft()
            future.result()
            yield key

    def close(self) -> list[Any]:
        """Stop: the queued images not started are dropped, those being written finish. The keys of the images
        written that :meth:`finished` has not yet given, in order."""
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
        done = [k for k, f in self.pending if f.done() and not f.cancelled() and f.exception() is None]
        self.pending.clear()
        return done


class _NotWritten(Exception):
    """An image queued after a failed write: not started."""


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
        batch_size: Most images per forward batch.
        batch_pixels: Most pixels per forward batch, at the size the model sees (:class:`SizeBuckets`).
        num_workers: Decoding processes.
        write_threads: Threads encoding and writing the files (:class:`FileWriters`).
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
    batch_pixels: int
    num_workers: int
    write_threads: int
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
        buckets = SizeBuckets(self.setup.batch_size, self.setup.batch_pixels, self.setup.max_size)
        self.bar = tqdm(total=len(todo), desc="infer", unit="img", dynamic_ncols=True, disable=not self.setup.progress)
        threads = self.setup.write_threads
        self.writers = FileWriters(threads, self.setup.batch_size + 2 * threads)
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
            self._written(block=True)
        finally:
            for rel in self.writers.close():  # an error or an interrupt: the images whose files were all written
                self._done(rel)
            self.bar.close()

    def _skip(self, src: Source, reason: str) -> None:
        self.skipped.append(Skipped(src.rel, reason))
        self._advance()

    def _advance(self) -> None:
        self.handled += 1
        self.bar.update(1)

    def _done(self, rel: str) -> None:
        self.finished.append(rel)
        self._advance()

    def _written(self, block: bool) -> None:
        for rel in self.writers.finished(block):
            self._done(rel)

    def _run_batch(self, batch: list[Item]) -> None:
        setup, segmenter = self.setup, self.setup.segmenter
        images = [raw for _, _, raw in batch]
        pred = segmenter.run_batch(images, setup.scales, setup.flip, setup.max_size, cams=setup.cams)
        keep = segmenter.mask_classes(pred.cls_logits)  # each image's classes, decided on the host
        masks = pred.masks(keep) if self.crf is None else None
        logits = pred.small_logits(setup.logits_stride) if any("logits" in paths for _, paths, _ in batch) else None
        # the CAMs of the classes the classifier finds: an image's present classes are among them
        cams = pred.host_cams(segmenter.found_classes(pred.cls_logits)) if setup.cams else [None] * len(batch)
        jobs = []
        for i, (src, paths, raw) in enumerate(batch):
            small = None if logits is None else logits[i]
            if masks is None:
                index = keep[i].nonzero()[:, 0].to(torch.uint8).numpy()
                probs = pred.probabilities(i, keep[i], self.crf.on_device)
                jobs.append(((pred.cls_logits[i], src, paths, raw, small, cams[i], index), raw, probs))
            else:
                self._finish(pred.cls_logits[i], src, paths, raw, small, cams[i], masks[i])
        del pred  # the batch's logits: on a GPU the CRF below runs in this call, and needs only the probabilities
        if jobs:
            self.crf.submit(jobs)
        self._collect(block=False)
        self._written(block=False)

    def _collect(self, block: bool) -> None:
        """Write the files of the images whose CRF jobs finished (see :meth:`CrfJobs.ready`)."""
        if self.crf is None:
            return
        for (cls_logits, src, paths, raw, small, cams, index), labels in self.crf.ready(block):
            if isinstance(labels, Exception):
                self._skip(src, f"dense CRF failed ({type(labels).__name__}: {labels})")
            else:  # the CRF's labels index the classes it got
                self._finish(cls_logits, src, paths, raw, small, cams, index[labels])

    def _finish(
        self,
        cls_logits: Tensor,
        src: Source,
        paths: dict[str, Path],
        raw: np.ndarray,
        small: np.ndarray | None,
        cams: ImageCams | None,
        mask: np.ndarray,
    ) -> None:
        """Queue the writes of the image ``src``: its ``small`` logits (when asked for), the files that follow from
        its classifier's ``cls_logits`` (C-1,) and its ``mask`` (the CAM pictures from its host ``cams``), and last
        the mask."""
        segmenter = self.setup.segmenter
        names = segmenter.classes[1:]
        present, top1 = segmenter.present_classes(cls_logits, mask)
        entry = {
            "classes": segmenter.classes,
            "present": [n for n, p in zip(names, present.tolist(), strict=True) if p],
            "top1_fallback": top1,
            "scores": {n: round(p, 4) for n, p in zip(names, cls_logits.sigmoid().tolist(), strict=True)},
        }
        writes = [functools.partial(save_output, paths["logits"], _save_npy, small)] if "logits" in paths else []
        writes.append(functools.partial(save_output, paths["labels"], atomic_write_text, json.dumps(entry) + "\n"))
        if "cams" in paths:  # the pictures are made on a writer's thread
            writes.append(functools.partial(_write_cam_picture, paths["cams"], cams, present, cls_logits, raw,
                                            segmenter.classes))  # fmt: skip
        if "thumbs" in paths:  # the thumbnail last: it marks the image's CAM thumbnails complete
            writes.append(functools.partial(_write_thumbnails, self.setup.output, src.rel, paths["thumbs"], cams,
                                            present, raw))  # fmt: skip
        if "overlays" in paths:
            writes.append(lambda: save_output(paths["overlays"], save_image, mask_overlay(raw, mask)))
        writes.append(functools.partial(save_output, paths["masks"], save_mask, mask, self.palette))
        self.writers.submit(src.rel, writes)


def _write_cam_picture(path: Path, cams: ImageCams, present: Tensor, cls_logits: Tensor, raw: np.ndarray,
                       classes: list[str]) -> None:  # fmt: skip
    """Write ``path``: the full-size CAM picture of the image ``raw``, the heatmap of the max over the ``present``
    classes' CAMs blended over it (a band of rows at a time), under a band naming those classes with their scores
    (``cls_logits``) and showing the colour scale, each class named at its CAM's peak
    (:func:`~wsss.inference.folder.visualize.cam_legend`)."""
    shown = present.nonzero()[:, 0].tolist()
    height, width = raw.shape[:2]
    peaks = cam_peaks(cams.select(present), (height, width))
    scores = cls_logits.sigmoid()[present].tolist()
    legend = cam_legend(width, [classes[k + 1] for k in shown], scores, peaks, [k + 1 for k in shown])
    out = np.empty((legend.height + height, width, 3), np.uint8)
    for start, band in cams.bands(present):
        rows = slice(legend.height + start, legend.height + start + band.shape[-2])
        out[rows] = cam_overlay(raw[start : start + band.shape[-2]], band.numpy())
    draw_cam_legend(out, legend)
    save_output(path, save_image, out)


def _write_thumbnails(output: Path, rel: str, path: Path, cams: ImageCams, present: Tensor, raw: np.ndarray) -> None:
    """Write the thumbnail of input ``rel`` (its pixels ``raw``) at ``path`` and, first, the ``present`` classes'
    CAMs over it (:func:`~wsss.inference.folder.gallery.write_class_cams`): the thumbnail marks them complete."""
    thumb = thumbnail(raw, THUMB_SIZE)
    write_class_cams(output, rel, cam_thumbnails(thumb, cams.select(present)), (present.nonzero()[:, 0] + 1).tolist())
    save_output(path, save_image, thumb)


def _save_npy(path: Path, array: np.ndarray) -> None:
    buf = io.BytesIO()
    np.save(buf, array)
    atomic_write_bytes(path, buf.getvalue())
