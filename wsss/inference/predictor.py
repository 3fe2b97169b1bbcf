"""A Python predictor, as segment-anything's ``SamPredictor`` is for SAM: a model from a checkpoint, then a call
per image.

    from wsss.inference.predictor import Segmenter

    segmenter = Segmenter.from_checkpoint("work_dirs/voc_centered/iter_80000.pth")
    result = segmenter("photo.jpg", crf=True, cams=True)   # or an (H, W, 3) uint8 RGB array
    result.mask            # (H, W) uint8 class indices into segmenter.classes
    result.present         # ["dog", "person"]: classes whose image-level probability passes infer.cls_thresh

Every option defaults to the checkpoint's config (``infer.*``). ``tools/infer.py`` and
:func:`wsss.inference.runner.run_inference` run through :meth:`Segmenter.forward`, so the library and the CLI
share one inference path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from wsss.config import Config, ConfigError, InferConfig
from wsss.data.transforms import normalize
from wsss.engine.checkpoint import config_from_checkpoint, load_checkpoint, model_from_checkpoint
from wsss.inference.crf import crf_labels
from wsss.inference.export import load_safetensors
from wsss.models.tta import TTAOutput, predicted_classes, tta_forward
from wsss.utils.fileio import read_image

__all__ = ["Segmentation", "Segmenter", "read_model_file"]

_UNSET: Any = object()


@dataclass
class Segmentation:
    """What :meth:`Segmenter.__call__` returns for one image of (H, W) pixels.

    Attributes:
        mask: (H, W) uint8 class indices into ``classes`` (after the CRF when requested).
        class_probs: Image-level probability of each foreground class (sigmoid of the classifier logits,
            averaged over the TTA passes), by name.
        present: Foreground classes whose probability exceeds ``infer.cls_thresh``.
        cams: With ``cams=True``: (H, W) float32 CAM in [0, 1] of each present class (of the most probable
            class when none is present), by name; else None.
        classes: Every class name, background first.
    """

    mask: np.ndarray
    class_probs: dict[str, float]
    present: list[str]
    cams: dict[str, np.ndarray] | None
    classes: list[str]


def read_model_file(path: str | Path) -> dict[str, Any]:
    """A wsss checkpoint (``.pth``) or a ``tools/export.py --safetensors`` export, as a checkpoint dict whose config
    this version reads.

    Raises:
        FileNotFoundError: The file is missing.
        ValueError: The file is neither, or its config does not fit this version (one line naming the file).
    """
    if Path(path).suffix != ".safetensors":
        return load_checkpoint(path)
    ckpt = load_safetensors(path)
    try:
        config_from_checkpoint(ckpt)
    except ConfigError as err:
        raise ValueError(f"{path}: its config does not fit this version of wsss ({err})") from None
    return ckpt


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

    @classmethod
    def from_checkpoint(
        cls,
        path: str | Path | dict[str, Any],
        device: str | torch.device | None = None,
        infer: InferConfig | None = None,
    ) -> Segmenter:
        """Rebuild the model from a wsss checkpoint (``.pth``), an export of ``tools/export.py --safetensors``,
        or what :func:`~wsss.engine.checkpoint.load_checkpoint` returned. ``device`` defaults to CUDA when
        available; ``infer``, the inference settings, to the checkpoint's ``infer.*``.

        Raises:
            FileNotFoundError: The file is missing.
            ValueError: The file is not a wsss checkpoint, or its config does not describe its weights
                (:func:`~wsss.engine.checkpoint.model_from_checkpoint`: nothing is built then).
        """
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        ckpt = path if isinstance(path, dict) else read_model_file(path)
        model, _ = model_from_checkpoint(ckpt, device, source=None if isinstance(path, dict) else path)
        cfg: Config = config_from_checkpoint(ckpt)
        return cls(model, ckpt["classes"], ckpt["mean"], ckpt["std"], cfg.infer if infer is None else infer)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.no_grad()
    def forward(
        self,
        images: Sequence[np.ndarray],
        scales: Sequence[float] | None = None,
        flip: bool | None = None,
        max_size: int | None = _UNSET,
        cams: bool = False,
    ) -> TTAOutput:
        """Test-time-augmented outputs of same-size images at their own size.

        Args:
            images: (H, W, 3) uint8 RGB arrays, all of one size.
            scales: TTA scales (default ``infer.scales``).
            flip: Flip TTA (default ``infer.flip``).
            max_size: Longest side the model sees: a larger image is downscaled (bilinear, antialiased) and its
                logits and CAMs are upsampled back (default ``infer.max_size``; 0 or None: the original size).
            cams: Also compute the CAMs.

        Returns:
            :class:`~wsss.models.tta.TTAOutput` with ``seg`` (B, C, H, W) and ``cam`` (B, C-1, H, W).
        """
        scales = tuple(self.cfg.scales if scales is None else scales)
        flip = self.cfg.flip if flip is None else flip
        max_size = self.cfg.max_size if max_size is _UNSET else max_size
        x = torch.stack([normalize(raw, self.mean, self.std) for raw in images]).to(self.device)
        size = tuple(x.shape[-2:])
        if max_size and max(size) > max_size:
            factor = max_size / max(size)
            small = (max(1, round(size[0] * factor)), max(1, round(size[1] * factor)))
            x = F.interpolate(x, size=small, mode="bilinear", align_corners=False, antialias=True)
        out = tta_forward(self.model, x, scales, flip, cams=cams)
        if tuple(x.shape[-2:]) != size:
            out.seg = F.interpolate(out.seg, size=size, mode="bilinear", align_corners=False)
            if out.cam is not None:
                out.cam = F.interpolate(out.cam, size=size, mode="bilinear", align_corners=False)
        return out

    def __call__(
        self,
        image: np.ndarray | str | Path,
        scales: Sequence[float] | None = None,
        flip: bool | None = None,
        crf: bool = False,
        max_size: int | None = _UNSET,
        cams: bool = False,
    ) -> Segmentation:
        """Segment one image: an (H, W, 3) uint8 RGB array or an image file.

        ``scales``, ``flip`` and ``max_size`` are those of :meth:`forward`; ``crf`` refines the mask with the
        dense CRF (constants ``infer.crf``; needs pydensecrf2); ``cams`` also returns the CAMs.

        Raises:
            ValueError: The array is not (H, W, 3) uint8, or the file is not a readable image.
        """
        raw = read_image(image) if isinstance(image, (str, Path)) else np.asarray(image)
        if raw.ndim != 3 or raw.shape[2] != 3 or raw.dtype != np.uint8:
            raise ValueError(f"expected an (H, W, 3) uint8 RGB image, got {raw.dtype} array of shape {raw.shape}")
        out = self.forward([raw], scales, flip, max_size, cams)
        seg, cls_logits = out.seg[0], out.cls_logits[0]
        if crf:
            mask = crf_labels(raw, seg.softmax(dim=0).cpu().numpy(), self.cfg.crf)
        else:
            mask = seg.argmax(dim=0).to(torch.uint8).cpu().numpy()
        names = self.classes[1:]
        probs = cls_logits.sigmoid().tolist()
        shown, _ = predicted_classes(cls_logits, self.cfg.cls_thresh)
        cam_maps = None
        if cams:
            cam_maps = {names[k]: out.cam[0, k].cpu().numpy() for k in shown.nonzero()[:, 0].tolist()}
        return Segmentation(
            mask=mask,
            class_probs=dict(zip(names, probs, strict=True)),
            present=[n for n, p in zip(names, probs, strict=True) if p > self.cfg.cls_thresh],
            cams=cam_maps,
            classes=list(self.classes),
        )
