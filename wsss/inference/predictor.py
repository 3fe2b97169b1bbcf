"""A Python predictor, as segment-anything's ``SamPredictor`` is for SAM: a model from a checkpoint, then a call
per image.

    from wsss.inference.predictor import Segmenter

    segmenter = Segmenter.from_checkpoint("work_dirs/voc_centered/iter_80000.pth")
    result = segmenter.predict("photo.jpg", crf=True, cams=True)   # or an array, or a PIL image
    result.mask            # (H, W) uint8 class ids: indices into result.classes (background 0)
    result.scores          # (C-1,) float32 image-level probability of each foreground class (classes[1:])
    result.present_ids     # array([12, 15]): the classes the classifier finds in the image and the mask shows
    result.present         # ["dog", "person"]: their names
    result.cams            # {"dog": (H, W) float32, "person": ...}: the CAM of each present class
    results = segmenter.predict([a, b, "c.jpg"])   # a list in, a list of results out, in order

What the outputs mean, and how they agree:

- The classifier's classes: the foreground classes whose image-level probability (``scores``) exceeds
  ``infer.cls_thresh``; when none does, the single most probable class (``top1_fallback`` is then True), since
  a photo given to a segmenter is taken to show something.
- ``mask``: with ``infer.mask_classes = "present"`` (the default) the argmax (and the CRF) runs over the
  background and the classifier's classes only; with ``"all"`` (the reference's inference) over every class
  (docs/reference.md row 18 measures both).
- ``present``: the classifier's classes that the mask shows (at least one pixel), so a class is never named, given
  a CAM or captioned in the gallery while its mask is empty (a top-1 class whose logits lose to the background's
  everywhere, such as a grayscale photo's, is left out: ``present`` may then be empty). With ``"present"`` the mask
  holds exactly the background and ``present``; with ``"all"`` it may also hold classes the classifier calls absent.
- ``cams``: one CAM per ``present`` class.

Inputs: an image file (read as :func:`~wsss.utils.fileio.read_image` reads it: EXIF orientation, grayscale,
palette, RGBA composited on black, 16-bit), a ``PIL.Image`` (converted the same way, without the EXIF rotation,
so the mask matches the image's pixels), or a uint8 array of shape (H, W), (H, W, 1), (H, W, 3) RGB or (H, W, 4)
RGBA, in any memory layout.

Every option defaults to the checkpoint's config (``infer.*``). ``tools/infer.py`` and
:func:`wsss.inference.folder.runner.run_inference` run through :meth:`Segmenter.run_batch`, as :meth:`Segmenter.predict`
does, so the library and the CLI share one inference path.

Memory: the model sees an image with its longest side at most :func:`longest_side` (``infer.max_size``, and in any
case at most :data:`~wsss.config.validation.MAX_SIDE` px at the largest TTA scale, whatever ``max_size`` and the
scales come from: a checkpoint, ``--cfg-options`` or an argument); the outputs are brought to the image's own size a
band of rows at a time (:class:`BandResize`), so a 12000 x 12000 photo never holds full-size float logits, only the
uint8 mask.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor

from wsss.config import Config, InferConfig
from wsss.config.validation import MAX_SIDE
from wsss.data.transforms import channel_constants, normalize
from wsss.inference.crf import crf_labels
from wsss.inference.resize import BandResize, row_bands, shrink
from wsss.model_file import config_from_checkpoint, model_from_checkpoint, read_model_file, untrained_decoder_warning
from wsss.models.tta import TTAOutput, predicted_classes, tta_forward
from wsss.utils.distributed import rank_and_world
from wsss.utils.fileio import image_to_rgb, read_image
from wsss.utils.tensors import argmax, model_precision, to_device

__all__ = [
    "BandResize", "BatchOutputs", "Segmentation", "Segmenter", "as_rgb", "classes_shown", "longest_side", "model_size",
    "row_bands",
]  # fmt: skip

_UNSET: Any = object()
_COUNT_CHUNK = 1 << 20
"""Mask pixels per ``np.bincount`` (which counts in int64: 8 bytes a pixel for the chunk, not for a whole mask)."""
ImageLike = np.ndarray | Image.Image | str | Path
"""What :meth:`Segmenter.predict` takes as one image (:func:`as_rgb`)."""


@dataclass
class Segmentation:
    """What :meth:`Segmenter.predict` returns for one image of (H, W) pixels and C classes (the module docstring says
    how the fields agree). Everything is numpy or plain Python.

    Attributes:
        mask: (H, W) uint8 class ids, indices into ``classes`` (after the CRF when requested).
        scores: (C-1,) float32 image-level probability of each foreground class, in the order of ``classes[1:]``
            (sigmoid of the classifier logits, averaged over the TTA passes): ``scores[k - 1]`` is class k's.
        present_ids: (K,) int64 ids (into ``classes``, as in ``mask``), ascending, of the foreground classes whose
            score exceeds ``infer.cls_thresh``, or of the most probable one when none does (``top1_fallback``),
            that the mask shows (:meth:`Segmenter.present_classes`).
        present: The K names of ``present_ids``.
        top1_fallback: No class passed ``infer.cls_thresh``; ``present`` is the most probable class, or empty when
            the mask does not show it.
        cams: With ``cams=True``: (H, W) float32 CAM in [0, 1] of each ``present`` class, by name; else None.
        classes: Every class name, background first.
    """

    mask: np.ndarray
    scores: np.ndarray
    present_ids: np.ndarray
    present: list[str]
    top1_fallback: bool
    cams: dict[str, np.ndarray] | None
    classes: list[str]

    @property
    def class_probs(self) -> dict[str, float]:
        """``scores`` by foreground class name (what ``labels/<image>.json`` of ``tools/infer.py`` holds)."""
        return dict(zip(self.classes[1:], self.scores.tolist(), strict=True))


def longest_side(max_size: int | None, scales: Sequence[float]) -> int:
    """The longest side an image is brought to before the TTA ``scales``: ``max_size``, lowered to what keeps the
    largest scale within :data:`~wsss.config.validation.MAX_SIDE` px; 0 or None (no cap of its own): that ceiling.
    So the model never sees a side over ``MAX_SIDE``, whatever the source of the two settings."""
    ceiling = max(1, int(MAX_SIDE / max(scales)))
    return min(max_size, ceiling) if max_size else ceiling


def model_size(size: tuple[int, int], max_size: int) -> tuple[int, int]:
    """The (h, w) an image of ``size`` is brought to before the TTA scales: its own, or downscaled to ``max_size`` on
    its longest side (:func:`longest_side`) where that is longer."""
    if max(size) <= max_size:
        return size
    factor = max_size / max(size)
    return max(1, round(size[0] * factor)), max(1, round(size[1] * factor))


def classes_shown(mask: np.ndarray, count: int) -> np.ndarray:
    """(count,) bool: which of ``count`` class ids the uint8 ``mask`` holds (counted a million pixels at a time)."""
    flat = mask.reshape(-1)
    shown = np.zeros(count, dtype=bool)
    for start in range(0, flat.size, _COUNT_CHUNK):
        shown |= np.bincount(flat[start : start + _COUNT_CHUNK], minlength=count)[:count] > 0
    return shown


def as_rgb(image: Any) -> np.ndarray:
    """An image given to :class:`Segmenter` as an (H, W, 3) uint8 RGB array (the module docstring lists what is
    accepted). Such an array comes back as it is, in its memory layout, read-only too: nothing writes to it, and
    what needs another layout copies (:func:`~wsss.data.transforms.normalize` makes its float copy from any).

    Raises:
        FileNotFoundError: A path that does not exist.
        ValueError: A file that is not a readable image, or an array of another kind; the message says the
            conversion.
    """
    if isinstance(image, (str, Path)):
        if not Path(image).exists():
            raise FileNotFoundError(f"image not found: {image}")
        return read_image(image)
    if isinstance(image, Image.Image):
        return image_to_rgb(image)
    if isinstance(image, (list, tuple)):
        raise ValueError(
            f"expected an image, got a {type(image).__name__} of {len(image)}: Segmenter.predict takes one image "
            "or a flat list of images (paths, PIL images or uint8 arrays)"
        )
    if isinstance(image, Tensor):
        raise ValueError(
            "expected a numpy array, a PIL image or a path, got a torch.Tensor: pass image.cpu().numpy() "
            "as (H, W, 3) uint8 RGB"
        )
    arr = np.asarray(image)
    if arr.ndim == 3 and arr.shape[0] in (1, 3, 4) and arr.shape[2] not in (1, 3, 4):
        raise ValueError(
            f"expected channels last (H, W, 3), got shape {arr.shape} (channels first): pass x.transpose(1, 2, 0)"
        )
    if arr.dtype != np.uint8:
        if np.issubdtype(arr.dtype, np.floating):
            fix = "values in [0, 1]: (x * 255).round().astype(np.uint8); in [0, 255]: x.round().astype(np.uint8)"
        else:
            fix = "scale it to [0, 255] and convert with x.astype(np.uint8)"
        raise ValueError(f"expected a uint8 image, got {arr.dtype} array of shape {arr.shape}; for {fix}")
    if arr.ndim == 3 and arr.shape[2] == 1:
        arr = arr[..., 0]
    if arr.ndim == 2:
        return np.repeat(arr[..., None], 3, axis=2)
    if arr.ndim == 3 and arr.shape[2] == 4:
        return image_to_rgb(Image.fromarray(np.ascontiguousarray(arr), "RGBA"))
    if arr.ndim != 3 or arr.shape[2] != 3:
        raise ValueError(
            f"expected an (H, W), (H, W, 1), (H, W, 3) RGB or (H, W, 4) RGBA uint8 image, got shape {arr.shape}"
        )
    return arr


@dataclass
class ImageCams:
    """One image's CAMs of some foreground classes on the host, at the resolution the model saw, and what brings them
    to the image's size a band at a time (:meth:`BatchOutputs.host_cams`): its pictures are made from them on any
    thread, without the device.

    Attributes:
        cam: (K, h, w) float32 CPU tensor: the CAMs of the classes ``classes`` selects, in class order.
        classes: (C-1,) bool, K of them True.
        resize: A CPU :class:`~wsss.inference.resize.BandResize` from (h, w) to the image's size.
        rows: ``(start, stop)`` of the bands of output rows.
    """

    cam: Tensor
    classes: Tensor
    resize: BandResize
    rows: list[tuple[int, int]]

    def select(self, chosen: Tensor) -> Tensor:
        """(K', h, w): the CAMs of the classes ``chosen`` (a (C-1,) bool within :attr:`classes`)."""
        if (chosen & ~self.classes).any():
            raise ValueError(f"CAMs of classes {(chosen & ~self.classes).nonzero()[:, 0].tolist()} were not copied")
        return self.cam[chosen[self.classes]]

    def bands(self, chosen: Tensor) -> Iterator[tuple[int, Tensor]]:
        """Bands ``(start, (K', rows, W))`` of the full-size CAMs of the classes ``chosen``."""
        cams = self.select(chosen)
        for start, stop in self.rows:
            yield start, self.resize.band(cams, start, stop)


@dataclass
class BatchOutputs:
    """TTA outputs of same-size images at the resolution the model saw (:meth:`Segmenter.run_batch`), with what
    brings them to the images' own size a band at a time: the torch-level building block of
    :meth:`Segmenter.predict` and of the folder runner.

    The host waits for the device twice per batch, whatever its size: for the classifier's logits
    (:attr:`cls_logits`, from which the host decides each image's classes) and for the masks (:meth:`masks`), and
    once more for the CAMs (:meth:`host_cams`) when they are asked for. Class selections given to the methods are
    host tensors.

    Attributes:
        out: ``seg`` (B, C, h, w) logits, ``cls_logits`` (B, C-1), ``cam`` (B, C-1, h, w) or None.
        size: (H, W) of the images.
        band_pixels: Pixels per band when resizing (0: one band).
    """

    out: TTAOutput
    size: tuple[int, int]
    band_pixels: int

    def __post_init__(self) -> None:
        self.resize = BandResize(tuple(self.out.seg.shape[-2:]), self.size, self.out.seg.device)

    def bands(self) -> Iterator[tuple[int, int]]:
        return row_bands(self.size[0], self.size[1], self.band_pixels)

    @functools.cached_property
    def cls_logits(self) -> Tensor:
        """(B, C-1) float32 classifier logits on the host (copied once)."""
        return self.out.cls_logits.float().cpu()

    def masks(self, keep: Tensor) -> np.ndarray:
        """(B, H, W) uint8: the argmax of each image's logits over the classes its row of ``keep`` ((B, C) bool)
        allows, computed on the device and copied to the host in one piece."""
        device = self.out.seg.device
        masks = torch.empty((len(keep), *self.size), dtype=torch.uint8, device=device)
        for i, allowed in enumerate(keep):
            index = to_device(allowed.nonzero()[:, 0], device)
            logits = self.out.seg[i].index_select(0, index)
            for start, stop in self.bands():
                masks[i, start:stop] = index.take(argmax(self.resize.band(logits, start, stop), 0))
        return masks.cpu().numpy()

    def probabilities(self, i: int, keep: Tensor, on_device: bool = False) -> np.ndarray | Tensor:
        """(K, H, W) float32 softmax of image ``i``'s logits over the K classes ``keep`` (a (C,) bool) allows (the
        CRF's input; its labels index ``keep.nonzero()``): a numpy array, or with ``on_device`` a tensor on the
        model's device (for the torch CRF there)."""
        logits = self.out.seg[i].index_select(0, to_device(keep.nonzero()[:, 0], self.out.seg.device))
        bands = (self.resize.band(logits, start, stop).float().softmax(dim=0) for start, stop in self.bands())
        if on_device:
            return torch.cat(list(bands), dim=1)
        probs = np.empty((logits.shape[0], *self.size), np.float32)
        for (start, stop), band in zip(self.bands(), bands, strict=True):
            probs[:, start:stop] = band.cpu().numpy()
        return probs

    def host_cams(self, classes: Tensor) -> list[ImageCams]:
        """Each image's CAMs of the foreground classes its row of ``classes`` ((B, C-1) bool) selects, on the host
        (:class:`ImageCams`): the batch's copied in one piece."""
        if self.out.cam is None:
            raise ValueError("the CAMs were not computed: call Segmenter.run_batch with cams=True")
        cam = self.out.cam
        which = classes.flatten().nonzero()[:, 0]  # image i's class k is row i (C-1) + k of the flattened CAMs
        copied = cam.flatten(0, 1).index_select(0, to_device(which, cam.device)).float().cpu()
        resize = self.resize if cam.device.type == "cpu" else BandResize(cam.shape[-2:], self.size, copied.device)
        rows = list(self.bands())
        parts = copied.split(classes.sum(dim=1).tolist())
        return [ImageCams(part, chosen, resize, rows) for part, chosen in zip(parts, classes, strict=True)]

    def small_logits(self, factor: int) -> np.ndarray:
        """(B, C, ceil(H/factor), ceil(W/factor)) float16 logits (bilinear, antialiased when shrinking), copied to
        the host in one piece: bilinear upsampling to (H, W) recovers the full maps."""
        size = (-(-self.size[0] // factor), -(-self.size[1] // factor))
        small = F.interpolate(self.out.seg.float(), size=size, mode="bilinear", align_corners=False, antialias=True)
        return small.to(torch.float16).cpu().numpy()


class Segmenter:
    """A trained model with its class names, preprocessing and inference settings.

    Args:
        model: A :class:`~wsss.models.segmentor.WSSSModel` in eval mode.
        classes: Class names, background first.
        mean: Normalisation mean the model was trained with.
        std: Normalisation std.
        cfg: Test-time settings (scales, flip, class threshold, max size, CRF constants).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        classes: Sequence[str],
        mean: Sequence[float],
        std: Sequence[float],
        cfg: InferConfig,
    ) -> None:
        self.model = model.eval()
        self.classes = list(classes)
        self.mean, self.std = tuple(mean), tuple(std)
        self.cfg = cfg
        self._constants: tuple[Tensor, Tensor] | None = None

    @classmethod
    def from_checkpoint(
        cls,
        path: str | Path | dict[str, Any],
        device: str | torch.device | None = None,
        infer: InferConfig | None = None,
        source: str | Path | None = None,
    ) -> Segmenter:
        """Rebuild the model from a wsss checkpoint (``.pth``), an export of ``tools/export.py --safetensors``,
        or what :func:`~wsss.model_file.read_model_file` returned. ``device`` defaults to CUDA when
        available; ``infer``, the inference settings, to the checkpoint's ``infer.*``; ``source`` names a loaded
        checkpoint in messages.

        A checkpoint saved before its decoder trained predicts meaningless masks: a warning on stderr says so (on
        rank 0 of a process group; :func:`~wsss.model_file.untrained_decoder_warning`).

        Raises:
            FileNotFoundError: The file is missing.
            ValueError: The file is not a wsss checkpoint, or its config does not describe its weights
                (:func:`~wsss.model_file.model_from_checkpoint`: nothing is built then).
        """
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        ckpt = path if isinstance(path, dict) else read_model_file(path)
        source = source or (None if isinstance(path, dict) else path)
        model, _ = model_from_checkpoint(ckpt, device, source=source)
        warning = untrained_decoder_warning(ckpt, source or "the checkpoint")
        if warning and rank_and_world()[0] == 0:
            print(warning, file=sys.stderr)
        cfg: Config = config_from_checkpoint(ckpt)
        return cls(model, ckpt["classes"], ckpt["mean"], ckpt["std"], cfg.infer if infer is None else infer)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def mask_classes(self, cls_logits: Tensor) -> Tensor:
        """(..., C-1) classifier logits -> (..., C) bool: the classes the mask may hold (``infer.mask_classes``):
        the background and the present classes (top-1 rule), or every class."""
        if self.cfg.mask_classes == "all":
            return cls_logits.new_ones((*cls_logits.shape[:-1], cls_logits.shape[-1] + 1), dtype=torch.bool)
        found = self.found_classes(cls_logits)
        return torch.cat([found.new_ones((*found.shape[:-1], 1)), found], dim=-1)

    def found_classes(self, cls_logits: Tensor) -> Tensor:
        """(..., C-1) classifier logits -> (..., C-1) bool: the foreground classes the classifier finds
        (``infer.cls_thresh``, or its top-1 when none passes); an image's ``present`` classes are among them."""
        return predicted_classes(cls_logits, self.cfg.cls_thresh)[0]

    def present_classes(self, cls_logits: Tensor, mask: np.ndarray) -> tuple[Tensor, bool]:
        """The ``present`` classes of an image: (C-1,) bool, the classes the classifier finds (``infer.cls_thresh``,
        or its top-1 when none passes) that the (H, W) uint8 ``mask`` shows; and whether the top-1 rule chose them.
        ``cls_logits``: its (C-1,) logits on the host."""
        chosen, top1 = predicted_classes(cls_logits, self.cfg.cls_thresh)
        return chosen & torch.from_numpy(classes_shown(mask, len(self.classes))[1:]), bool(top1)

    def model_input(self, raw: np.ndarray, size: tuple[int, int], band_pixels: int) -> Tensor:
        """(3, h, w) normalised model input of an (H, W, 3) uint8 image: at its own size, or downscaled to ``size``
        (bilinear, antialiased): the width of each band of ``band_pixels`` pixels, then the height of the narrow
        image, which is ``F.interpolate`` of the whole normalised image up to float rounding without the full-size
        float image."""
        if self._constants is None or self._constants[0].device != self.device:  # uploaded once
            self._constants = channel_constants(self.mean, self.device), channel_constants(self.std, self.device)
        mean, std = self._constants
        if tuple(raw.shape[:2]) == tuple(size):
            return normalize(raw, mean, std, self.device)

        def band(start: int, stop: int) -> Tensor:
            return normalize(raw[start:stop], mean, std, self.device)[None]

        return shrink(band, raw.shape[:2], size, band_pixels)[0]

    @torch.no_grad()
    def run_batch(
        self,
        images: Sequence[np.ndarray],
        scales: Sequence[float] | None = None,
        flip: bool | None = None,
        max_size: int | None = _UNSET,
        cams: bool = False,
    ) -> BatchOutputs:
        """Test-time-augmented outputs of same-size images at the resolution the model sees (what
        :meth:`predict` and the folder runner build their results from).

        Args:
            images: (H, W, 3) uint8 RGB arrays (:func:`as_rgb`), all of one size.
            scales: TTA scales (default ``infer.scales``).
            flip: Flip TTA (default ``infer.flip``).
            max_size: Longest side an image is brought to before the scales (default ``infer.max_size``; 0 or None:
                no cap of its own), lowered by :func:`longest_side` so that the largest scale stays within
                :data:`~wsss.config.validation.MAX_SIDE` px: a larger image is downscaled (bilinear, antialiased)
                and its outputs are brought back to its size by :class:`BatchOutputs`, in bands of ``max_size**2``
                pixels.
            cams: Also compute the CAMs.
        """
        scales = tuple(self.cfg.scales if scales is None else scales)
        flip = self.cfg.flip if flip is None else flip
        max_size = longest_side(self.cfg.max_size if max_size is _UNSET else max_size, scales)
        size = tuple(images[0].shape[:2])
        small = model_size(size, max_size)
        x = torch.stack([self.model_input(raw, small, max_size**2) for raw in images])
        with model_precision(self.cfg.fp32_precision, self.cfg.dtype, self.device):
            out = tta_forward(self.model, x, scales, flip, cams=cams)
        return BatchOutputs(out, size, max_size**2)

    def forward(
        self,
        images: Sequence[np.ndarray],
        scales: Sequence[float] | None = None,
        flip: bool | None = None,
        max_size: int | None = _UNSET,
        cams: bool = False,
    ) -> TTAOutput:
        """:meth:`run_batch`'s outputs resized whole to the images' size: ``seg`` (B, C, H, W), ``cam``
        (B, C-1, H, W). Full-size float maps take 4 bytes per class and pixel; :meth:`run_batch` avoids them."""
        pred = self.run_batch(images, scales, flip, max_size, cams)
        out = pred.out
        cam = None if out.cam is None else pred.resize.full(out.cam)
        return TTAOutput(seg=pred.resize.full(out.seg), cls_logits=out.cls_logits, cam=cam)

    def predict(
        self,
        images: ImageLike | Sequence[ImageLike],
        scales: Sequence[float] | None = None,
        flip: bool | None = None,
        crf: bool = False,
        max_size: int | None = _UNSET,
        cams: bool = False,
        batch_size: int = 1,
    ) -> Segmentation | list[Segmentation]:
        """Segment one image, or each image of a list: a file, a ``PIL.Image`` or a uint8 array (:func:`as_rgb`).

        One image in, one :class:`Segmentation` out; a list (or tuple) in, a list of :class:`Segmentation` out, in
        its order, each at its own image's size (images of any sizes may be mixed). ``segmenter(x)`` is
        ``segmenter.predict(x)``.

        Args:
            images: An image or a list of images.
            scales: TTA scales (default ``infer.scales``).
            flip: Flip TTA (default ``infer.flip``).
            crf: Refine the mask with the dense CRF (``infer.crf``: constants and backend; ``torch`` runs on the
                model's device).
            max_size: Longest side the model sees (:meth:`run_batch`; default ``infer.max_size``).
            cams: Also return the CAM of each present class.
            batch_size: Consecutive images of one size run through the model this many at a time (results equal
                those of 1 up to float rounding).

        Raises:
            FileNotFoundError: A path that does not exist.
            ValueError: A file that is not a readable image, or an array of a kind :func:`as_rgb` refuses (the
                message says the conversion).
        """
        if not isinstance(images, (list, tuple)):
            return self.predict([images], scales, flip, crf, max_size, cams)[0]
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        results: list[Segmentation] = []
        pending: list[np.ndarray] = []  # decoded as they come: a long list of paths is never held decoded

        def run() -> None:
            batch = self.run_batch(pending, scales, flip, max_size, cams)
            keep = self.mask_classes(batch.cls_logits)
            masks = None if crf else batch.masks(keep)
            on_host = batch.host_cams(self.found_classes(batch.cls_logits)) if cams else [None] * len(pending)
            for i, raw in enumerate(pending):
                mask = None if masks is None else masks[i]
                results.append(self._result(batch, i, raw, keep[i], mask, on_host[i]))
            pending.clear()

        for image in images:
            raw = as_rgb(image)
            if pending and (len(pending) == batch_size or raw.shape != pending[0].shape):
                run()
            pending.append(raw)
        if pending:
            run()
        return results

    __call__ = predict

    def _result(
        self, batch: BatchOutputs, i: int, raw: np.ndarray, keep: Tensor, mask: np.ndarray | None,
        cams: ImageCams | None,
    ) -> Segmentation:  # fmt: skip
        """The :class:`Segmentation` of image ``i`` of ``batch``, whose pixels are ``raw``: its ``mask`` given, or
        None for the dense CRF's over the classes ``keep`` allows; with its ``cams``, when asked for."""
        cls_logits = batch.cls_logits[i]
        if mask is None:
            probs = batch.probabilities(i, keep, on_device=self.cfg.crf.backend == "torch")
            labels = crf_labels(raw, probs, self.cfg.crf)
            labels = labels.cpu().numpy() if isinstance(labels, Tensor) else labels
            mask = keep.nonzero()[:, 0].to(torch.uint8).numpy()[labels]
        present, top1 = self.present_classes(cls_logits, mask)
        ids = present.nonzero()[:, 0].numpy().astype(np.int64) + 1
        names = [self.classes[k] for k in ids.tolist()]
        cam_maps = None
        if cams is not None:
            cam_maps = {name: np.empty(batch.size, np.float32) for name in names}
            for start, band in cams.bands(present):
                for name, plane in zip(names, band, strict=True):
                    cam_maps[name][start : start + plane.shape[0]] = plane.numpy()
        return Segmentation(
            mask=mask,
            scores=cls_logits.sigmoid().numpy(),
            present_ids=ids,
            present=names,
            top1_fallback=top1,
            cams=cam_maps,
            classes=list(self.classes),
        )
