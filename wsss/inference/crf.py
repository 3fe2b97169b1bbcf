"""Dense CRF post-processing (Krähenbühl & Koltun 2011) with pydensecrf2, serial or in a process pool.

The unary is ``-log(clip(p, 1e-5, 1))`` of the class probabilities (as ``pydensecrf.utils.unary_from_softmax``);
the pairwise terms are a Gaussian smoothness kernel (``gaussian_sxy``, ``gaussian_compat``) and a bilateral
appearance kernel on the RGB image (``bilateral_sxy``, ``bilateral_srgb``, ``bilateral_compat``), both with
Potts compatibility; ``iterations`` mean-field steps. Every constant comes from :class:`wsss.config.CrfConfig`
(defaults: docs/design.md section 3).

The CRF is single-threaded C++ and takes about as long as a DeiT-S forward pass per image, so
:class:`CrfPool` runs it in ``CrfConfig.workers`` processes while the caller keeps feeding the model:
submit a job as soon as an image's probabilities exist and collect the finished ones later.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor

import numpy as np

from wsss.config import CrfConfig
from wsss.utils.lifetime import die_with_parent

UNARY_CLIP = 1e-5
"""Probabilities are clipped to ``[UNARY_CLIP, 1]`` before the log (pydensecrf's ``unary_from_softmax``)."""

__all__ = ["CrfPool", "UNARY_CLIP", "crf_labels", "dense_crf"]


def _densecrf_module():
    try:
        import pydensecrf.densecrf as dcrf
    except ImportError as err:
        raise ImportError(
            "dense CRF post-processing needs the 'pydensecrf2' package (import name pydensecrf): "
            "pip install pydensecrf2. Or run without --crf."
        ) from err
    return dcrf


def dense_crf(image: np.ndarray, probs: np.ndarray, cfg: CrfConfig | None = None) -> np.ndarray:
    """Refine per-pixel class probabilities with a fully connected CRF.

    Args:
        image: (H, W, 3) uint8 RGB, the image the probabilities belong to (bilateral kernel).
        probs: (C, H, W) class probabilities (e.g. the softmax of the segmentation logits).
        cfg: Kernel constants and iterations; default :class:`CrfConfig`'s.

    Returns:
        (C, H, W) float32 mean-field marginals (each pixel sums to 1).

    Raises:
        ImportError: pydensecrf2 is not installed.
        ValueError: The image and the probabilities do not match.
    """
    cfg = cfg or CrfConfig()
    dcrf = _densecrf_module()
    if image.ndim != 3 or image.shape[2] != 3 or probs.ndim != 3 or probs.shape[1:] != image.shape[:2]:
        raise ValueError(f"dense_crf needs an (H, W, 3) image and (C, H, W) probs, got {image.shape}, {probs.shape}")
    c, h, w = probs.shape
    unary = -np.log(np.clip(probs.reshape(c, -1).astype(np.float32), UNARY_CLIP, 1.0))
    crf = dcrf.DenseCRF2D(w, h, c)
    crf.setUnaryEnergy(np.ascontiguousarray(unary))
    crf.addPairwiseGaussian(sxy=cfg.gaussian_sxy, compat=cfg.gaussian_compat)
    crf.addPairwiseBilateral(
        sxy=cfg.bilateral_sxy,
        srgb=cfg.bilateral_srgb,
        rgbim=np.ascontiguousarray(image, dtype=np.uint8),
        compat=cfg.bilateral_compat,
    )
    q = crf.inference(cfg.iterations)
    return np.asarray(q, dtype=np.float32).reshape(c, h, w)


def crf_labels(image: np.ndarray, probs: np.ndarray, cfg: CrfConfig | None = None) -> np.ndarray:
    """(H, W) uint8 argmax of :func:`dense_crf` (class indices; C must be <= 256)."""
    if probs.shape[0] > 256:
        raise ValueError(f"crf_labels returns uint8 class indices; {probs.shape[0]} classes do not fit")
    return dense_crf(image, probs, cfg).argmax(axis=0).astype(np.uint8)


class CrfPool:
    """Run :func:`crf_labels` jobs in worker processes (or inline with ``workers=0``).

    The workers start in the constructor, so create the pool before the model (and before any thread
    pool): with the default ``fork`` start method (where the platform has it) they then start in
    milliseconds and inherit no running threads. ``fork`` is safe here because a job runs only numpy and
    pydensecrf (plain C++, no OpenMP), never torch. ``spawn`` (the default elsewhere) re-imports the
    caller's ``__main__`` in every worker, which costs seconds when it imports torch. Results are
    bit-identical to a serial run (the CRF is deterministic). The workers die with the calling process
    (:func:`wsss.utils.lifetime.die_with_parent`); leaving the ``with`` block on an exception kills the
    running jobs instead of waiting for them.

    Args:
        cfg: CRF constants; ``cfg.workers`` processes unless ``workers`` is given.
        workers: Override of ``cfg.workers``; 0 runs every job in the calling process at submit time.
        start_method: ``fork``, ``forkserver`` or ``spawn``; None picks ``fork`` where available.

    Example:
        >>> with CrfPool(cfg.infer.crf) as pool:
        ...     futures = [pool.submit(image, probs) for image, probs in items]   # non-blocking
        ...     labels = [f.result() for f in futures]                           # (H, W) uint8 each
    """

    def __init__(self, cfg: CrfConfig, workers: int | None = None, start_method: str | None = None) -> None:
        self.cfg = cfg
        self.workers = cfg.workers if workers is None else workers
        if self.workers < 0:
            raise ValueError(f"CRF workers must be >= 0, got {self.workers}")
        _densecrf_module()  # fail at start, not in the first job
        self._executor = None
        if self.workers > 0:
            if start_method is None:
                start_method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
            context = multiprocessing.get_context(start_method)
            self._executor = ProcessPoolExecutor(
                self.workers, mp_context=context, initializer=die_with_parent, initargs=(os.getpid(),)
            )
            for future in [self._executor.submit(_check_import) for _ in range(self.workers)]:
                future.result()  # start the workers now (and check pydensecrf imports in them)

    def submit(self, image: np.ndarray, probs: np.ndarray) -> Future:
        """Queue one job: ``image`` (H, W, 3) uint8, ``probs`` (C, H, W) -> Future of (H, W) uint8 labels.

        With workers the call returns at once; an exception in the job is raised by ``Future.result()``.
        """
        if self._executor is not None:
            return self._executor.submit(crf_labels, image, probs, self.cfg)
        return _run_now(crf_labels, image, probs, self.cfg)

    def close(self) -> None:
        """Wait for the queued jobs and stop the workers."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def __enter__(self) -> CrfPool:
        return self

    def __exit__(self, *exc) -> None:
        if self._executor is None:
            return
        if exc[0] is not None:  # interrupted (Ctrl-C, SIGTERM, an error): stop the running jobs too
            for process in list(getattr(self._executor, "_processes", {}).values()):
                process.kill()
        self._executor.shutdown(wait=True, cancel_futures=exc[0] is not None)
        self._executor = None


def _check_import() -> None:
    _densecrf_module()


def _run_now(fn: Callable, *args) -> Future:
    future: Future = Future()
    try:
        future.set_result(fn(*args))
    except Exception as err:  # delivered through the future, as a pool would
        future.set_exception(err)
    return future
