"""Dense CRF post-processing (Krähenbühl & Koltun 2011): mean-field inference of a fully connected CRF.

The unary is ``-log(clip(p, 1e-5, 1))`` of the class probabilities (as ``pydensecrf.utils.unary_from_softmax``);
the pairwise terms are a Gaussian smoothness kernel (``gaussian_sxy``, ``gaussian_compat``) and a bilateral
appearance kernel on the RGB image (``bilateral_sxy``, ``bilateral_srgb``, ``bilateral_compat``), both with
Potts compatibility and symmetric normalisation; ``iterations`` mean-field steps. Every constant comes from
:class:`wsss.config.CrfConfig` (defaults: docs/design.md section 3).

Two backends (``CrfConfig.backend``):

- ``torch`` (default): the same algorithm in PyTorch over a permutohedral lattice
  (:mod:`wsss.inference.crf.permutohedral`), on the device of the probabilities, many images of any sizes per call
  (:func:`dense_crf_batch`). Nothing to compile. Its marginals equal pydensecrf's to float32 precision
  (tests/inference/test_crf_parity.py; docs/reference.md row 19). On the CPU it is faster than pydensecrf per core
  (docs/benchmarks.md, "Dense CRF"), and :class:`CrfPool` given ``device="cpu"`` runs it in worker processes
  beside the model, as it runs pydensecrf.
- ``pydensecrf``: the reference C++ (pydensecrf2, source-only on PyPI: installing it needs a compiler), single
  threaded, so :class:`CrfPool` runs it in ``CrfConfig.workers`` processes while the caller keeps feeding the model.

Memory: bounded by ``CrfConfig.memory_mib`` per call, on the CPU and on CUDA, for both backends. A call's estimate
(:func:`estimated_bytes`) is its pixels x (:data:`BYTES_PER_PIXEL` + :data:`BYTES_PER_PIXEL_AND_CLASS` x classes), the
torch backend's measured worst case as peak RSS (pydensecrf needs less), or on the Triton kernels' path
(``infer.crf.kernel=fused``) its own, as its allocator counts it (:data:`KERNEL_BYTES_PER_PIXEL`,
:data:`KERNEL_BYTES_PER_PIXEL_AND_CLASS`: at 21 classes half as much, so its runs hold twice the images). An image whose
estimate exceeds the budget runs at the largest reduced resolution that fits (:func:`working_size`: the image and the
probabilities shrunk, antialiased, a band of rows at a time; the kernel widths in pixels scaled with them), and its
marginals come back to full size bilinearly, a band of rows at a time for the labels. A batch is split into calls that
each fit. Beyond the budget the caller holds its inputs (the image, 3 bytes per pixel; the probabilities, 4 per pixel
and class) and :func:`dense_crf`'s full-size marginals.
"""

from __future__ import annotations

import math
import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import replace

import numpy as np
import torch
from torch import Tensor

from wsss.config import CrfConfig
from wsss.inference.crf import permutohedral
from wsss.inference.crf.permutohedral import build_lattice, workspace_for
from wsss.inference.resize import BandResize, row_bands, shrink
from wsss.utils.lifetime import die_with_parent
from wsss.utils.tensors import argmax, to_device

UNARY_CLIP = 1e-5
"""Probabilities are clipped to ``[UNARY_CLIP, 1]`` before the log (pydensecrf's ``unary_from_softmax``)."""
NORM_EPS = 1e-20
"""Added to a kernel's sum of weights before its inverse square root (pydensecrf's ``NORMALIZE_SYMMETRIC``)."""

BYTES_PER_PIXEL = 4096
"""Peak working memory of the torch backend per pixel for its two lattices and their construction (sort keys, sparse
matrices): 3.2-4.0 KB measured as peak RSS on the CPU on colour noise of 0.02-0.5 Mpx (the most lattice points an
image can have; photographs need about half), tests/inference/test_crf.py::test_peak_memory_stays_within_the_budget.
"""
BYTES_PER_PIXEL_AND_CLASS = 64
"""And per pixel and class (marginals, unary, messages, the lattice's values): 61 B measured with 2 and 81 classes."""
KERNEL_BYTES_PER_PIXEL = 1536
"""The Triton kernels' path (:func:`uses_kernels`), per pixel: the most its allocator holds at once, as
``BYTES_PER_PIXEL`` with the per-class part below: on colour noise 1,223 B at 2 classes for a 500 x 375 image and up
to 1,424 for smaller ones (a batch of 8 of 64 x 48); the lattices with their neighbours instead of blur matrices,
no sparse library's buffers. Measured on the CPU with the simplices kernel interpreted (``bench/bench_crf.py
--memory``; tests/inference/test_crf_kernels.py measures it on a GPU where one is present)."""
KERNEL_BYTES_PER_PIXEL_AND_CLASS = 56
"""And per pixel and class: the marginals, the unary and the lattice values (about five lattice points per pixel on
noise): 4,117 B at 81 classes for 500 x 375, up to 5,099 for 16 images of 32 x 24."""
KERNEL_MESSAGE_BYTES = 4
"""And per pixel and class where the slices cannot take the softmax (more channels than one program holds,
``kernels.SOFTMAX_CHANNELS``): the message, which the slices then write before the softmax reads it."""
CPU_RUN_PIXELS = 2**16
"""On the CPU a mean-field run holds images of at most this many pixels in all (larger images run one by one): one
lattice over many large images loses the cache, with nothing to gain where no kernel launch is saved (5 photographs
of 500 x 375, 21 classes, one thread: 0.76 images/s in one run against 1.24 one by one, bench/bench_crf.py)."""

__all__ = [
    "BYTES_PER_PIXEL", "BYTES_PER_PIXEL_AND_CLASS", "CPU_RUN_PIXELS", "CrfPool", "KERNEL_BYTES_PER_PIXEL",
    "KERNEL_BYTES_PER_PIXEL_AND_CLASS", "KERNEL_MESSAGE_BYTES", "NORM_EPS", "UNARY_CLIP", "estimated_bytes",
    "crf_labels", "crf_labels_stacked", "dense_crf", "dense_crf_batch", "finds_simplices_by_kernel", "uses_kernels",
    "working_size",
]  # fmt: skip


def _densecrf_module():
    try:
        import pydensecrf.densecrf as dcrf
    except ImportError as err:
        raise ImportError(
            "infer.crf.backend=pydensecrf needs the 'pydensecrf2' package (import name pydensecrf), which builds "
            "from source: pip install pydensecrf2 (needs a C++ compiler), or use infer.crf.backend=torch."
        ) from err
    return dcrf


def dense_crf(image: np.ndarray | Tensor, probs: np.ndarray | Tensor, cfg: CrfConfig | None = None):
    """Refine per-pixel class probabilities with a fully connected CRF.

    Args:
        image: (H, W, 3) uint8 RGB, the image the probabilities belong to (bilateral kernel); any memory layout,
            read-only arrays too.
        probs: (C, H, W) finite class probabilities (e.g. the softmax of the segmentation logits), C >= 1. A tensor
            runs on its device (torch backend).
        cfg: Kernel constants, iterations, backend and memory budget; default :class:`CrfConfig`'s.

    Returns:
        (C, H, W) float32 mean-field marginals (each pixel sums to 1): a tensor on ``probs``' device when
        ``probs`` is a tensor, else a numpy array. An image over the budget ran at :func:`working_size` and its
        marginals are resized to (H, W).

    Raises:
        ImportError: backend ``pydensecrf`` without pydensecrf2 installed.
        ValueError: The inputs are not as above (one line naming what is wrong).
    """
    cfg = cfg or CrfConfig()
    _check_pair(image, probs)
    q = _full_size(*_refine_one(image, probs, cfg))
    return q if isinstance(probs, Tensor) else q.numpy()


def crf_labels(image: np.ndarray | Tensor, probs: np.ndarray | Tensor, cfg: CrfConfig | None = None):
    """(H, W) uint8 argmax of :func:`dense_crf` (class indices; C must be <= 256): a tensor on ``probs``' device
    when ``probs`` is a tensor, else a numpy array. An image over the budget never holds full-size marginals: they
    are resized and argmaxed a band of rows at a time."""
    cfg = cfg or CrfConfig()
    _check_pair(image, probs)
    if probs.shape[0] > 256:
        raise ValueError(f"crf_labels returns uint8 class indices; {probs.shape[0]} classes do not fit")
    labels = _labels(*_refine_one(image, probs, cfg))
    return labels if isinstance(probs, Tensor) else labels.cpu().numpy()


def crf_labels_stacked(image: np.ndarray | Tensor, probs: Tensor, cfg: CrfConfig | None = None) -> Tensor:
    """:func:`crf_labels` of several probability maps of one image, (S, C, H, W) -> (S, H, W) uint8 labels on
    ``probs``' device. The torch backend filters the S maps together over one pair of lattices (built once, one pass
    over S x C values per product); each result equals its own :func:`crf_labels` up to float summation order. The
    pydensecrf backend runs them one by one.

    Raises:
        ValueError: The inputs are not as :func:`dense_crf` needs them (one line naming what is wrong).
    """
    cfg = cfg or CrfConfig()
    if probs.ndim != 4:
        raise ValueError(f"crf_labels_stacked needs (S, C, H, W) probabilities, got shape {tuple(probs.shape)}")
    stacks, classes = probs.shape[:2]
    flat = probs.reshape(stacks * classes, *probs.shape[2:])
    _check_pair(image, flat)
    if classes > 256:
        raise ValueError(f"crf_labels returns uint8 class indices; {classes} classes do not fit")
    if cfg.backend != "torch":
        return torch.stack([_tensor(crf_labels(image, p, cfg), np.uint8).to(probs.device) for p in probs])
    return _stack_labels(*next(_refine_batch([image], [flat.float()], cfg, torch.float32, stacks)), stacks)


def working_size(height: int, width: int, classes: int, cfg: CrfConfig, fused: bool = False) -> tuple[int, int]:
    """(h, w) the CRF of an image of (height, width) pixels and ``classes`` classes runs at: its own size when its
    estimate (:func:`estimated_bytes`; ``fused``: on the Triton kernels' path) fits ``cfg.memory_mib``, else the
    largest size of about its aspect that does."""
    limit = cfg.memory_mib * 2**20 // estimated_bytes(1, classes, fused)
    if height * width <= limit:
        return height, width
    h = max(1, int(height * math.sqrt(limit / (height * width))))
    w = max(1, min(width, limit // h))
    return min(h, limit // w), w  # a thin image keeps its one column or row


def dense_crf_batch(
    images: Sequence[np.ndarray | Tensor], probs: Sequence[Tensor], cfg: CrfConfig, dtype: torch.dtype = torch.float32
) -> list[Tensor]:
    """:func:`dense_crf` (torch backend) of many images in as few mean-field runs as the memory budget allows, each
    image with its own lattice.

    The images may differ in size and in number of classes: every pixel of every image of a run is one row of one
    lattice whose keys carry the image index, so no two images share a lattice point and each result equals a call
    on its own image (up to float summation order). Consecutive images share a run while their estimate fits
    ``cfg.memory_mib``; an image over it runs alone at :func:`working_size`.

    Args:
        images: (H_i, W_i, 3) uint8 RGB arrays or tensors.
        probs: (C_i, H_i, W_i) float probability tensors, all on one device (where the CRF runs).
        cfg: Kernel constants, iterations and memory budget.
        dtype: Of the mean-field (float32 as pydensecrf; float64 shows how far float32 rounding moves a result, and
            runs PyTorch's products whatever ``cfg.kernel``).

    Returns:
        (C_i, H_i, W_i) marginals of ``dtype`` on that device, one per image.

    Raises:
        ValueError: An image or its probabilities are not as above (one line naming what is wrong).
    """
    for error in _check_pairs(images, probs):
        if error is not None:
            raise error
    return [_full_size(q, size) for q, size in _refine_batch(images, probs, cfg, dtype)]


def estimated_bytes(pixels: int, classes: int, fused: bool) -> int:
    """The memory a mean-field run of ``pixels`` pixels (all its images') and ``classes`` channels is held to (the
    module docstring): with ``fused`` (the Triton kernels' path, :func:`uses_kernels`) its allocator's peak, else the
    PyTorch path's peak RSS."""
    if fused:
        message = KERNEL_MESSAGE_BYTES if classes > permutohedral.kernels.SOFTMAX_CHANNELS else 0
        return pixels * (KERNEL_BYTES_PER_PIXEL + (KERNEL_BYTES_PER_PIXEL_AND_CLASS + message) * classes)
    return pixels * (BYTES_PER_PIXEL + BYTES_PER_PIXEL_AND_CLASS * classes)


def _refine_one(image: np.ndarray | Tensor, probs: np.ndarray | Tensor, cfg: CrfConfig) -> tuple[Tensor, tuple]:
    """The (C, h, w) float32 marginals of one checked image at :func:`working_size` (on ``probs``' device), and its
    (H, W)."""
    if cfg.backend == "torch":
        return next(_refine_batch([image], [_tensor(probs, np.float32)], cfg, torch.float32))
    image, small, run = _reduced(image, _tensor(probs, np.float32), cfg)
    q = torch.from_numpy(_pydensecrf(_numpy(image), _numpy(small), run))
    return q.to(probs.device) if isinstance(probs, Tensor) else q, tuple(probs.shape[1:])


def _refine_batch(images: Sequence[np.ndarray | Tensor], probs: Sequence[Tensor], cfg: CrfConfig,
                  dtype: torch.dtype, stacks: int = 1) -> Iterator[tuple[Tensor, tuple]]:  # fmt: skip
    """(marginals at :func:`working_size`, (H, W)) of each checked image, in runs that fit the budget, a run at a time:
    a caller that keeps less than the marginals (:func:`_torch_jobs`: the labels) holds one run's at once. With
    ``stacks`` > 1 each image's channels are that many stacks of classes (:func:`_mean_field`)."""
    if not probs:
        return
    device = probs[0].device
    fused = dtype == torch.float32 and uses_kernels(cfg, device)
    for run in _runs([tuple(p.shape) for p in probs], cfg, fused, CPU_RUN_PIXELS if device.type == "cpu" else None):
        with torch.no_grad(), torch.autocast(device.type, enabled=False):  # float32 products, no graph
            if len(run) == 1:  # alone: at a reduced resolution when over the budget
                image, small, run_cfg = _reduced(images[run[0]], probs[run[0]], cfg, fused)
                q = _mean_field([image], [small], run_cfg, dtype, stacks)
            else:
                q = _mean_field([images[k] for k in run], [probs[k] for k in run], cfg, dtype, stacks)
        for k in run:  # each image's marginals handed over, and let go, in turn
            yield q.pop(0), tuple(probs[k].shape[1:])


def _runs(shapes: list[tuple[int, int, int]], cfg: CrfConfig, fused: bool = False,
          max_pixels: int | None = None) -> list[list[int]]:  # fmt: skip
    """The images of each mean-field run, by index: consecutive (C, H, W) ``shapes`` while the run's estimate (its
    pixels at its most classes, :func:`estimated_bytes`) fits ``cfg.memory_mib``, and its pixels ``max_pixels``."""
    runs: list[list[int]] = []
    pixels = classes = 0
    for k, (c, h, w) in enumerate(shapes):
        fits = estimated_bytes(pixels + h * w, max(classes, c), fused) <= cfg.memory_mib * 2**20
        if runs and fits and (max_pixels is None or pixels + h * w <= max_pixels):
            runs[-1].append(k)
            pixels, classes = pixels + h * w, max(classes, c)
        else:
            runs.append([k])
            pixels, classes = h * w, c
    return runs


def _reduced(image: np.ndarray | Tensor, probs: Tensor, cfg: CrfConfig,
             fused: bool = False) -> tuple[Tensor, Tensor, CrfConfig]:  # fmt: skip
    """``image``, ``probs`` and ``cfg`` as the CRF runs them: as they are when the image fits the budget, else the
    image (uint8) and the probabilities at :func:`working_size`, with the kernel widths in pixels scaled alike."""
    c, height, width = probs.shape
    h, w = working_size(height, width, c, cfg, fused)
    if (h, w) == (height, width):
        return image, probs, cfg
    rgb = _tensor(image, np.uint8).to(probs.device)
    small_rgb = shrink(lambda a, b: rgb[a:b].permute(2, 0, 1)[None].float(), (height, width), (h, w), h * w)
    small_rgb = small_rgb[0].round_().clamp_(0, 255).to(torch.uint8).permute(1, 2, 0).contiguous()
    small = shrink(lambda a, b: probs[None, :, a:b].float(), (height, width), (h, w), h * w)[0]
    factor = math.sqrt(h * w / (height * width))
    run = replace(cfg, gaussian_sxy=cfg.gaussian_sxy * factor, bilateral_sxy=cfg.bilateral_sxy * factor)
    return small_rgb, small, run


def _full_size(q: Tensor, size: tuple[int, int]) -> Tensor:
    """The (C, h, w) marginals ``q`` resized (bilinear) to ``size`` (H, W), or as they are at that size."""
    return q if tuple(q.shape[1:]) == tuple(size) else BandResize(q.shape[1:], size, q.device).full(q)


def _stack_labels(q: Tensor, size: tuple[int, int], stacks: int) -> Tensor:
    """(S, H, W) uint8 :func:`_labels` of each of the ``stacks`` stacks of classes of the marginals ``q``."""
    return torch.stack([_labels(m, size) for m in q.view(stacks, -1, *q.shape[1:])])


def _labels(q: Tensor, size: tuple[int, int]) -> Tensor:
    """(H, W) uint8 argmax of the (C, h, w) marginals ``q`` resized to ``size`` (H, W), a band of rows at a time."""
    if tuple(q.shape[1:]) == tuple(size):
        return argmax(q, 0).to(torch.uint8)
    resize = BandResize(q.shape[1:], size, q.device)
    labels = torch.empty(size, dtype=torch.uint8, device=q.device)
    for start, stop in row_bands(*size, q.shape[1] * q.shape[2]):
        labels[start:stop] = argmax(resize.band(q, start, stop), 0)
    return labels


def _mean_field(images: Sequence[np.ndarray | Tensor], probs: Sequence[Tensor], cfg: CrfConfig,
                dtype: torch.dtype, stacks: int = 1) -> list[Tensor]:  # fmt: skip
    """The (C_i, H_i, W_i) marginals of each image. With ``stacks`` > 1 each image's C_i channels are that many stacks
    of C_i / stacks classes, each normalised on its own (:func:`crf_labels_stacked`); the images' stacks are padded to
    the most classes of any (absent classes: p = 0)."""
    device = probs[0].device
    sizes = [p.shape[1] * p.shape[2] for p in probs]
    classes = max(p.shape[0] for p in probs) // stacks  # per stack
    unary = torch.full((sum(sizes), stacks, classes), float("inf"), dtype=dtype, device=device)  # absent: p = 0
    rows, features_g, features_b, positions = 0, [], [], {}
    sxy_g, sxy_b, srgb = (to_device(torch.tensor(v, dtype=torch.float32), device)
                          for v in (cfg.gaussian_sxy, cfg.bilateral_sxy, cfg.bilateral_srgb))  # fmt: skip
    for image, p in zip(images, probs, strict=True):
        if p.device != device:
            raise ValueError(f"dense_crf_batch needs every probability tensor on one device: {p.device} != {device}")
        c, h, w = p.shape
        values = p.detach().float().reshape(stacks, c // stacks, -1).permute(2, 0, 1)
        unary[rows : rows + h * w, :, : c // stacks] = -values.clamp(UNARY_CLIP, 1.0).log().to(dtype)
        rows += h * w
        if (h, w) not in positions:  # once per size in a run (the concatenation below copies them)
            y, x = torch.meshgrid(torch.arange(h, device=device), torch.arange(w, device=device), indexing="ij")
            xy = torch.stack([x.reshape(-1), y.reshape(-1)], dim=1).float()  # pydensecrf: (x, y) = (column, row)
            # true division, as pydensecrf's i / sx (CUDA would multiply by a reciprocal for a Python scalar)
            positions[h, w] = (xy / sxy_g, xy / sxy_b)
        rgb = to_device(_tensor(image, np.uint8), device).reshape(-1, 3).float()
        features_g.append(positions[h, w][0])
        features_b.append(torch.cat([positions[h, w][1], rgb / srgb], dim=1))
    fused = dtype == torch.float32 and uses_kernels(cfg, device)
    kernels = [_potts_kernel(torch.cat(features), sizes, compat, cfg, dtype, fused)
               for features, compat in ((features_g, cfg.gaussian_compat), (features_b, cfg.bilateral_compat))
               if compat != 0]  # fmt: skip
    del features_g, features_b, positions  # not held through the iterations
    prior = unary.view(unary.shape[0], -1).neg_()  # -unary, in its buffer
    q, message = torch.empty_like(prior), prior.clone()
    _softmax(message.view(-1, classes), q.view(-1, classes))  # each stack on its own
    # fused: message = prior + the kernels' filters in one launch per product (both slices in one), and the slice
    # takes the softmax (of each stack) into q where one program holds a row's classes: no message stored
    fused = fused and bool(kernels)
    fused_softmax = fused and prior.shape[1] <= permutohedral.kernels.SOFTMAX_CHANNELS
    if fused_softmax:
        message = None
    sliced = q if fused_softmax else message
    # every buffer made once: a fresh one per product or iteration costs its page faults on the CPU (Lattice.filter)
    if fused and len(kernels) == 2:
        workspace = permutohedral.pair_workspace((kernels[0], kernels[1]), prior.shape[1], dtype, device)
    else:
        workspace = workspace_for(kernels, prior.shape[1], dtype, device) if kernels else None
    for _ in range(cfg.iterations):  # no name left holding a lattice after the loop (the del below)
        if fused and len(kernels) == 2:
            permutohedral.filter_pair_fused((kernels[0], kernels[1]), q, sliced, workspace, base=prior,
                                            softmax=fused_softmax, groups=stacks)  # fmt: skip
        elif fused:
            kernels[0].filter_fused(q, sliced, workspace, base=prior, softmax=fused_softmax, groups=stacks)
        else:
            message.copy_(prior)
            for k in range(len(kernels)):
                kernels[k].filter(q, add_to=message, workspace=workspace)
        if not fused_softmax:
            _softmax(message.view(-1, classes), q.view(-1, classes))  # each stack on its own
    del kernels, workspace, message, sliced, prior, unary  # before the images' marginals are copied out of q
    out, rows, q = [], 0, q.view(-1, stacks, classes)
    for p in probs:
        c, h, w = p.shape
        out.append(q[rows : rows + h * w, :, : c // stacks].permute(1, 2, 0).reshape(c, h, w).contiguous())
        rows += h * w
    return out


def _potts_kernel(features: Tensor, sizes: list[int], compat: float, cfg: CrfConfig, dtype: torch.dtype,
                  fused: bool) -> permutohedral.Lattice:  # fmt: skip
    """The lattice of ``features`` scaled so that its filter gives ``compat`` x the symmetrically normalised Gaussian
    filter (Potts: subtracted from the message); its construction's tensors are let go on return."""
    lattice = build_lattice(features, sizes, dtype, cfg.reference_padding, fused, blur_directions=cfg.blur_directions,
                            simplices_kernel=finds_simplices_by_kernel(cfg, features.device))  # fmt: skip
    ones = features.new_ones(features.shape[0], 1, dtype=dtype)
    if fused:
        filtered = lattice.filter_fused(ones, torch.empty_like(ones), workspace_for([lattice], 1, dtype, ones.device))
    else:
        filtered = lattice.filter(ones)
    norm = (filtered + NORM_EPS).rsqrt()
    return lattice.scaled(compat * norm, norm)


def uses_kernels(cfg: CrfConfig, device: str | torch.device) -> bool:
    """Whether the ``torch`` backend's float32 mean-field on ``device`` runs its products in Triton kernels
    (``cfg.kernel``: ``fused``; ``auto`` takes the path measured faster on the device, PyTorch's products on every one
    so far: on an H200 the Triton kernels took 17.2 ms per VOC image at 21 classes in batches of 16 against 11.9, and
    68.2 against 32.6 per COCO image at 81, docs/benchmarks.md "On an H200")."""
    if cfg.kernel == "auto":
        return False
    if cfg.kernel == "fused" and permutohedral.kernels is None:
        raise ModuleNotFoundError("infer.crf.kernel='fused' needs the triton package (pip install triton)")
    return cfg.kernel == "fused"


def finds_simplices_by_kernel(cfg: CrfConfig, device: str | torch.device) -> bool:
    """Whether the lattices' construction finds each point's simplex and weights in the Triton kernel
    (:func:`wsss.inference.crf.kernels.simplices`: the same float32 roundings, so the same lattice, in one launch
    instead of about 80 PyTorch operations per lattice): on the Triton kernels' path (:func:`uses_kernels`), and with
    ``auto`` on CUDA where triton is installed, beside PyTorch's products: a GPU's CRF run cost about 17.6 ms whatever
    its images (docs/benchmarks.md "A CRF run's operations on a GPU")."""
    if cfg.kernel == "auto":
        return torch.device(device).type == "cuda" and permutohedral.kernels is not None
    return uses_kernels(cfg, device)


def _softmax(message: Tensor, out: Tensor) -> None:
    """``out`` = the softmax of each row of (N, C) ``message`` (overwritten below 16 classes). Below 16 classes
    torch's kernel is slow (187,500 rows, one thread: 3 classes 9.7 ms against 1.9 ms this way, 12 classes 27.4
    against 5.0); from 16 it is the faster one (16: 2.8 against 5.8; 21: 5.2 against 8.7)."""
    if message.shape[1] >= 16:
        torch.softmax(message, dim=1, out=out)
        return
    message.sub_(message.amax(dim=1, keepdim=True)).exp_()
    torch.div(message, message.sum(dim=1, keepdim=True), out=out)


def _pydensecrf(image: np.ndarray, probs: np.ndarray, cfg: CrfConfig) -> np.ndarray:
    """(C, H, W) float32 marginals from pydensecrf2 (the reference)."""
    dcrf = _densecrf_module()
    c, h, w = probs.shape
    unary = -np.log(np.clip(probs.reshape(c, -1), UNARY_CLIP, 1.0))
    crf = dcrf.DenseCRF2D(w, h, c)
    crf.setUnaryEnergy(np.ascontiguousarray(unary, dtype=np.float32))
    crf.addPairwiseGaussian(sxy=cfg.gaussian_sxy, compat=cfg.gaussian_compat)
    crf.addPairwiseBilateral(
        sxy=cfg.bilateral_sxy,
        srgb=cfg.bilateral_srgb,
        rgbim=np.require(image, np.uint8, ["C", "W"]),  # pydensecrf's typed buffer refuses read-only arrays
        compat=cfg.bilateral_compat,
    )
    q = crf.inference(cfg.iterations)
    return np.asarray(q, dtype=np.float32).reshape(c, h, w)


def _check_pair(image: np.ndarray | Tensor, probs: np.ndarray | Tensor) -> None:
    """Refuse inputs the CRF would turn into nonsense without a word, in one line naming what is wrong.

    Raises:
        ValueError: The shapes do not match, the image is not uint8, it has no pixel, there is no class, or a
            probability is NaN or infinite (which would spread to every pixel of the image through the lattice).
    """
    error = _check_pairs([image], [probs])[0]
    if error is not None:
        raise error


def _check_pairs(
    images: Sequence[np.ndarray | Tensor], probs: Sequence[np.ndarray | Tensor]
) -> list[ValueError | None]:
    """:func:`_check_pair` of many pairs: the ``ValueError`` of each, or None. Whether the probabilities are finite is
    read once per device for all of them (a GPU waits once per batch, not once per image), from each map's sum (one
    operation an image: NaN or infinite where any value is); the pixels that are not are counted only in such a map."""
    errors: list[ValueError | None] = []
    for image, p in zip(images, probs, strict=True):
        try:
            _check_shapes(image, p)
            errors.append(None)
        except ValueError as err:
            errors.append(err)
    ok = [k for k, error in enumerate(errors) if error is None]
    # float32 sums (a float16 map's sum could overflow; one that does anyway is only counted below, and passes)
    finite = {k: probs[k].sum(dtype=torch.float32) if isinstance(probs[k], Tensor) else np.isfinite(probs[k]).all()
              for k in ok}  # fmt: skip
    for device in {f.device for f in finite.values() if isinstance(f, Tensor)}:
        keys = [k for k, f in finite.items() if isinstance(f, Tensor) and f.device == device]
        finite.update(zip(keys, torch.isfinite(torch.stack([finite[k] for k in keys])).tolist(), strict=True))
    for k in (k for k, f in finite.items() if not f):
        bad = (~torch.isfinite(torch.as_tensor(probs[k]))).any(0).sum()
        if bad:
            pixels = probs[k].shape[1] * probs[k].shape[2]
            errors[k] = ValueError(
                f"dense_crf needs finite probabilities: {int(bad)} of {pixels} pixels hold NaN or an infinity (the "
                "CRF would spread it to every pixel of the image)"
            )
    return errors


def _check_shapes(image: np.ndarray | Tensor, probs: np.ndarray | Tensor) -> None:
    """:func:`_check_pair` but the finiteness."""
    if image.ndim != 3 or image.shape[2] != 3 or probs.ndim != 3 or tuple(probs.shape[1:]) != tuple(image.shape[:2]):
        raise ValueError(
            f"dense_crf needs an (H, W, 3) image and (C, H, W) probs, got {tuple(image.shape)}, {tuple(probs.shape)}"
        )
    if image.dtype not in (np.uint8, torch.uint8):
        raise ValueError(
            f"dense_crf needs a uint8 RGB image (0-255), got {image.dtype}: convert it first (a 16-bit image: "
            "(image >> 8).astype(np.uint8)); other values would wrap around modulo 256"
        )
    if not image.shape[0] or not image.shape[1]:
        raise ValueError(f"dense_crf needs an image of at least 1 x 1 pixels, got {image.shape[0]} x {image.shape[1]}")
    if not probs.shape[0]:
        raise ValueError(f"dense_crf needs probabilities of at least 1 class, got shape {tuple(probs.shape)}")


def _numpy(array: np.ndarray | Tensor) -> np.ndarray:
    return array.detach().cpu().numpy() if isinstance(array, Tensor) else np.asarray(array)


def _tensor(array: np.ndarray | Tensor, dtype: type) -> Tensor:
    """A tensor as it is, or a numpy array as a tensor of ``dtype`` (a view, read-only or negatively strided array
    is copied)."""
    return array if isinstance(array, Tensor) else torch.from_numpy(np.require(array, dtype, ["C", "W"]))


class CrfPool:
    """Run :func:`crf_labels` jobs: batched in the calling process (``torch`` backend), or in worker processes
    (``pydensecrf`` backend, and ``torch`` on the CPU when the caller says so with ``device="cpu"``; inline with
    ``workers=0``).

    With the ``torch`` backend and no ``device`` (or another than the CPU) a job runs at once on the probabilities'
    device (a GPU where the model runs), and :meth:`submit_batch` runs many images in one mean-field pass; no
    process is started. With ``device="cpu"`` its jobs go to the workers as pydensecrf's do, one image per job on
    one thread each, so the CRF runs beside the model instead of between its batches (tools/test.py ``--crf`` on
    the toy val set, 2 cores: docs/benchmarks.md, "Dense CRF").

    The workers start in the constructor, so create the pool before the model (and before any thread pool): with
    the default ``fork`` start method (where the platform has it) they then start in milliseconds and inherit no
    running threads. ``fork`` is safe here because a job runs pydensecrf (plain C++, no OpenMP) and torch on one
    thread only (:func:`_start_worker`: an OpenMP region in a child forked from a parent that used OpenMP hangs
    with GNU libgomp, so a worker never enters one; on one thread torch's CPU kernels and MKL run inline). ``spawn``
    (the default elsewhere) re-imports the caller's ``__main__`` in every worker, which costs seconds when it
    imports torch. Results are bit-identical to a serial run (the CRF is deterministic). The workers die with the
    calling process (:func:`wsss.utils.lifetime.die_with_parent`); leaving the ``with`` block on an exception kills
    the running jobs instead of waiting for them.

    Args:
        cfg: CRF constants and backend; ``cfg.workers`` processes unless ``workers`` is given.
        workers: Override of ``cfg.workers``; 0 runs every job in the calling process at submit time.
        start_method: ``fork``, ``forkserver`` or ``spawn``; None picks ``fork`` where available.
        device: Where the caller's model runs: ``cpu`` sends the ``torch`` backend's jobs to the workers; None or
            a GPU keeps them in the calling process, on the probabilities' device.

    Example:
        >>> with CrfPool(cfg.infer.crf) as pool:
        ...     futures = pool.submit_batch(images, probs)   # non-blocking with pydensecrf workers
        ...     labels = [f.result() for f in futures]       # (H, W) uint8 numpy each
    """

    def __init__(
        self,
        cfg: CrfConfig,
        workers: int | None = None,
        start_method: str | None = None,
        device: str | torch.device | None = None,
    ) -> None:
        self.cfg = cfg
        self.workers = cfg.workers if workers is None else workers
        if self.workers < 0:
            raise ValueError(f"CRF workers must be >= 0, got {self.workers}")
        self._executor = None
        self.batched = cfg.backend == "torch" and (device is None or torch.device(device).type != "cpu")
        """Jobs run at once in the calling process, many images per mean-field run (the ``torch`` backend)."""
        if self.batched:
            self.workers = 0
            return
        if cfg.backend == "pydensecrf":
            _densecrf_module()  # fail at start, not in the first job
        if self.workers > 0:
            if start_method is None:
                start_method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
            context = multiprocessing.get_context(start_method)
            self._executor = ProcessPoolExecutor(
                self.workers, mp_context=context, initializer=_start_worker, initargs=(os.getpid(),)
            )
            for future in [self._executor.submit(_check_import, cfg.backend) for _ in range(self.workers)]:
                future.result()  # start the workers now (and check pydensecrf imports in them)

    def submit(self, image: np.ndarray, probs: np.ndarray | Tensor) -> Future:
        """Queue one job: ``image`` (H, W, 3) uint8, ``probs`` (C, H, W) -> Future of (H, W) uint8 labels.

        With workers the call returns at once; an exception in the job is raised by ``Future.result()``.
        """
        return self.submit_batch([image], [probs])[0]

    def submit_batch(self, images: Sequence[np.ndarray], probs: Sequence[np.ndarray | Tensor]) -> list[Future]:
        """:meth:`submit` of many images; the ``torch`` backend in the calling process runs them in one batched
        call."""
        if self.batched:
            return _torch_jobs(images, probs, self.cfg)
        probs = [_numpy(p) for p in probs]
        if self._executor is not None:
            return [self._executor.submit(crf_labels, i, p, self.cfg) for i, p in zip(images, probs, strict=True)]
        return [_run_now(crf_labels, i, p, self.cfg) for i, p in zip(images, probs, strict=True)]

    def submit_stacked(self, images: Sequence[np.ndarray], probs: Sequence[Tensor]) -> list[list[Future]]:
        """:meth:`submit_batch` of S probability maps per image, (S, C_i, H_i, W_i) each (the same S for all) -> for
        each image S futures of its (H_i, W_i) uint8 labels. The ``torch`` backend filters an image's S maps together
        over one pair of lattices (:func:`crf_labels_stacked`): in the calling process the batch in as few
        mean-field runs as the memory budget allows, in a worker (``device="cpu"``) one job per image; pydensecrf
        runs S jobs per image."""
        if any(p.ndim != 4 for p in probs) or len({len(p) for p in probs}) > 1:
            shapes = [tuple(p.shape) for p in probs]
            raise ValueError(f"submit_stacked needs (S, C, H, W) probabilities with one S for all, got {shapes}")
        pairs = list(zip(images, probs, strict=True))
        if not pairs:
            return []
        if self.cfg.backend != "torch":
            each = len(probs[0])
            flat = self.submit_batch([i for i, p in pairs for _ in p], [m for _, p in pairs for m in p])
            return [flat[k * each : (k + 1) * each] for k in range(len(pairs))]
        if self.batched:
            jobs = _torch_jobs(images, [p.reshape(-1, *p.shape[2:]) for p in probs], self.cfg, len(probs[0]))
        elif self._executor is not None:
            jobs = [self._executor.submit(_stacked_numpy, i, _numpy(p), self.cfg) for i, p in pairs]
        else:
            jobs = [_run_now(_stacked_numpy, i, p, self.cfg) for i, p in pairs]
        return [[_part(job, s) for s in range(len(p))] for job, (_, p) in zip(jobs, pairs, strict=True)]

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


def _start_worker(parent: int) -> None:
    """A CRF worker: dies with ``parent``; torch runs on one thread, so no op opens an OpenMP region (the labels'
    argmax, the band resizing of a reduced image)."""
    die_with_parent(parent)
    torch.set_num_threads(1)


def _check_import(backend: str) -> None:
    if backend == "pydensecrf":
        _densecrf_module()


def _run_now(fn: Callable, *args) -> Future:
    future: Future = Future()
    try:
        future.set_result(fn(*args))
    except Exception as err:  # delivered through the future, as a pool would
        future.set_exception(err)
    return future


def _stacked_numpy(image: np.ndarray, probs: np.ndarray | Tensor, cfg: CrfConfig) -> np.ndarray:
    """:func:`crf_labels_stacked` as (S, H, W) uint8 numpy (a worker's job)."""
    return crf_labels_stacked(image, _tensor(probs, np.float32), cfg).cpu().numpy()


def _part(job: Future, index: int) -> Future:
    """A future of ``job.result()[index]`` (or of its exception)."""
    part: Future = Future()

    def copy(done: Future) -> None:
        if done.exception() is not None:
            part.set_exception(done.exception())
        else:
            part.set_result(done.result()[index])

    job.add_done_callback(copy)
    return part


def _torch_jobs(images: Sequence[np.ndarray], probs: Sequence[np.ndarray | Tensor], cfg: CrfConfig,
                stacks: int = 1) -> list[Future]:  # fmt: skip
    """Finished futures of (H, W) uint8 numpy labels (with ``stacks`` > 1 of (S, H, W): each image's channels that many
    stacks of classes, :func:`crf_labels_stacked`): the images whose inputs pass the checks run in as few mean-field
    runs as the memory budget allows, the others fail alone. On a GPU the host waits for the checks once and for the
    labels once (one copy of them all)."""
    futures = []
    for p, error in zip(probs, _check_pairs(images, probs), strict=True):
        futures.append(Future())
        if error is None and p.shape[0] // stacks > 256:
            error = ValueError(f"crf_labels returns uint8 class indices; {p.shape[0] // stacks} classes do not fit")
        if error is not None:
            futures[-1].set_exception(error)
    ok = [k for k, future in enumerate(futures) if not future.done()]
    tensors = [_tensor(probs[k], np.float32) for k in ok]
    try:
        labels = []
        for q, size in _refine_batch([images[k] for k in ok], tensors, cfg, torch.float32, stacks):
            labels.append(_stack_labels(q, size, stacks))
            del q  # before the next run starts
        flat = torch.cat([m.reshape(-1) for m in labels]).cpu().numpy() if labels else None
    except Exception as err:  # delivered through the futures, as a pool would
        for k in ok:
            futures[k].set_exception(err)
        return futures
    ends = np.cumsum([m.numel() for m in labels])
    for k, m, part in zip(ok, labels, np.split(flat, ends[:-1]), strict=True):
        futures[k].set_result(part.reshape(m.shape[1:] if stacks == 1 else m.shape))
    return futures
