"""Deployment exports of a checkpoint: weights-only safetensors that keep the config and classes, and ONNX.

- :func:`save_safetensors`: the model's tensors in a ``.safetensors`` file, with the resolved config, the class
  names, mean/std, step and commit as JSON in its metadata. No optimiser, no random state, no pickle;
  :func:`wsss.model_file.read_model_file` reads it back as it reads a checkpoint, so every tool that needs only the
  model takes it.
- :func:`export_onnx`: the single-scale segmentation model, ``image`` (B, 3, H, W) float32 normalised with the
  ``mean``/``std`` stored in the file's metadata -> ``seg`` (B, C, H, W) logits at the input's pixels and
  ``cls`` (B, C-1) classifier logits; B, H and W are dynamic. Made with ``torch.onnx.export(dynamo=True)``
  (needs the ``onnx`` and ``onnxscript`` packages).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from wsss.inference.folder.sources import writing
from wsss.model_file import EXPORT_METADATA_KEYS, model_from_checkpoint
from wsss.models.segmentor import WSSSModel, resize_to_image
from wsss.utils.fileio import atomic_write_bytes

__all__ = ["SegmentationExport", "export_onnx", "save_safetensors"]

ONNX_OPSET = 18
"""The first opset whose Resize has the antialiasing that timm's position-embedding resampling uses."""


def save_safetensors(ckpt: dict[str, Any], path: str | Path) -> None:
    """Write the weights of ``ckpt`` (a loaded wsss checkpoint) and its description to ``path`` atomically; read it
    back with :func:`wsss.model_file.read_model_file` (or :func:`~wsss.model_file.load_safetensors`).

    Raises:
        OutputError: ``path`` could not be written (a full disk); one line naming it, nothing left there.
    """
    from safetensors.torch import save

    tensors = {k: v.detach().cpu().contiguous() for k, v in ckpt["model"].items()}
    metadata = {"format": "pt", "wsss": "1", **{k: json.dumps(ckpt.get(k)) for k in EXPORT_METADATA_KEYS}}
    with writing(path):
        atomic_write_bytes(path, save(tensors, metadata=metadata))


class SegmentationExport(nn.Module):
    """The single-scale model as exported: normalised images -> (seg logits at the input's pixels, cls logits).

    The token-grid logits are upsampled to the padded extent and cropped
    (:func:`~wsss.models.segmentor.resize_to_image`) for every input size, so one graph serves sizes that are
    multiples of the patch size and those that are not; the numbers equal :func:`~wsss.models.tta.tta_forward`
    at scale 1 without flip.
    """

    def __init__(self, model: WSSSModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.model(image)
        return resize_to_image(out.seg, image.shape[-2:], self.model.stride), out.logits


def export_onnx(ckpt: dict[str, Any], path: str | Path) -> None:
    """Export the single-scale segmentation model of ``ckpt`` to ONNX at ``path`` (atomically).

    The example input is two images of 2 x 3 patches; batch, height and width are dynamic. The classes and
    the normalisation are stored in the model's metadata (``classes``, ``mean``, ``std`` as JSON).

    Raises:
        ImportError: onnx or onnxscript is missing.
        OutputError: ``path`` (or the temporary folder beside it) could not be written (a full disk); one line naming
            it, nothing left there.
    """
    try:
        import onnx
        import onnxscript  # noqa: F401  (torch.onnx's exporter needs it)
    except ImportError as err:
        raise ImportError(
            "ONNX export needs the 'onnx' and 'onnxscript' packages: pip install onnx onnxscript"
        ) from err
    model, _ = model_from_checkpoint(ckpt, "cpu")
    wrapper = SegmentationExport(model).eval()
    p = model.stride
    example = torch.zeros(2, 3, 2 * p, 3 * p)
    dims = {0: torch.export.Dim("batch", min=1, max=1024), 2: torch.export.Dim("height", min=2, max=16384),
            3: torch.export.Dim("width", min=2, max=16384)}  # fmt: skip
    with writing(path), tempfile.TemporaryDirectory(dir=Path(path).parent) as tmp:
        tmp_file = os.path.join(tmp, "model.onnx")
        torch.onnx.export(
            wrapper, (example,), tmp_file, input_names=["image"], output_names=["seg", "cls"],
            dynamic_shapes={"image": dims}, opset_version=ONNX_OPSET, dynamo=True, external_data=False, verbose=False,
        )  # fmt: skip
        proto = onnx.load(tmp_file)
    onnx.helper.set_model_props(proto, {key: json.dumps(ckpt[key]) for key in ("classes", "mean", "std")})
    with writing(path):
        atomic_write_bytes(path, proto.SerializeToString())
