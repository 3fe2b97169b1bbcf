"""Outputs brought to full size a band of rows at a time (the memory bound of huge images) equal the whole-image
computation, and the mask holds the classes ``infer.mask_classes`` allows."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from wsss.config import InferConfig
from wsss.data.transforms import normalize
from wsss.inference.predictor import BatchOutputs, Segmenter, row_bands
from wsss.inference.resize import interpolation_matrix
from wsss.models.tta import TTAOutput

pytestmark = pytest.mark.usefixtures("one_thread")

SIZE = (61, 47)


def full(maps):
    return F.interpolate(maps, size=SIZE, mode="bilinear", align_corners=False)


@pytest.mark.parametrize("band_pixels", [0, 47, 47 * 7, 10**6], ids=["one", "rows", "bands", "whole"])
def test_every_banded_output_equals_the_whole_image(band_pixels):
    """Banded masks, probabilities, CAMs equal those of F.interpolate of the whole map (bands of 1 row, of 7 rows
    with a short last band, and one band)."""
    gen = torch.Generator().manual_seed(0)
    seg, cam = torch.randn(2, 5, 13, 11, generator=gen), torch.rand(2, 4, 13, 11, generator=gen)
    pred = BatchOutputs(TTAOutput(seg=seg, cls_logits=torch.zeros(2, 4), cam=cam), SIZE, band_pixels)
    keep = torch.tensor([True, False, True, True, False])
    index = np.flatnonzero(keep.numpy())
    every = pred.masks(torch.ones(2, 5, dtype=torch.bool))
    masks = pred.masks(torch.stack([keep, torch.ones(5, dtype=torch.bool)]))
    np.testing.assert_array_equal(masks[0], index[full(seg)[0, index].argmax(0).numpy()])  # each image its own
    np.testing.assert_array_equal(masks[1], full(seg)[1].argmax(0).numpy())  # classes
    for i in range(2):
        np.testing.assert_array_equal(every[i], full(seg)[i].argmax(0).numpy())
        np.testing.assert_allclose(pred.probabilities(i, keep), full(seg)[i, index].softmax(0).numpy(), atol=1e-6)
        chosen = torch.tensor([False, True, True, False])
        copied = torch.tensor([[True, True, True, False], [False, True, True, True]])  # a superset of chosen
        bands = list(pred.host_cams(copied)[i].bands(chosen))
        with pytest.raises(ValueError, match=r"CAMs of classes \[0\] were not copied"):
            pred.host_cams(copied)[1].select(torch.tensor([True, True, False, False]))
        assert [start for start, _ in bands] == [start for start, _ in row_bands(*SIZE, band_pixels)]
        np.testing.assert_allclose(torch.cat([b for _, b in bands], dim=-2), full(cam)[i, chosen], atol=1e-6)


def test_a_downscaled_input_equals_the_antialiased_resize_of_the_normalised_image():
    """The model input of a large image, made from uint8 bands, equals F.interpolate (antialiased) of the whole
    normalised image."""
    raw = np.random.default_rng(0).integers(0, 256, (203, 157, 3), dtype=np.uint8)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    segmenter = Segmenter(torch.nn.Linear(1, 1), ["background"], mean, std, InferConfig())
    expected = F.interpolate(normalize(raw, mean, std)[None], size=(64, 49), mode="bilinear", align_corners=False,
                             antialias=True)[0]  # fmt: skip
    for band_pixels in (157, 157 * 10, 0):
        torch.testing.assert_close(segmenter.model_input(raw, (64, 49), band_pixels), expected, atol=2e-5, rtol=0)
    np.testing.assert_array_equal(segmenter.model_input(raw, raw.shape[:2], 157), normalize(raw, mean, std))


def test_the_mask_holds_the_classes_mask_classes_allows(toy_checkpoint):
    """``present``: background and the present classes only (the top-1 when none passes); ``all``: the plain
    argmax over every class, the reference."""
    from wsss.utils.fileio import read_image

    root, ckpt = toy_checkpoint
    raw = read_image(root / "JPEGImages" / "val_00000.jpg")
    restricted = Segmenter.from_checkpoint(ckpt, "cpu")
    assert restricted.cfg.mask_classes == "present"
    everything = Segmenter.from_checkpoint(ckpt, "cpu", InferConfig(**{**vars(restricted.cfg), "mask_classes": "all"}))
    seg = everything.forward([raw]).seg[0]
    np.testing.assert_array_equal(everything(raw).mask, seg.argmax(0).numpy())
    for thresh in (0.0, 0.5, 1.0):  # every class present; the checkpoint's rule; none passes (top-1)
        restricted.cfg.cls_thresh = thresh
        result = restricted(raw)
        assert result.top1_fallback == (thresh == 1.0) and len(result.present) >= 1
        allowed = [0] + [restricted.classes.index(n) for n in result.present]
        assert set(np.unique(result.mask).tolist()) <= set(allowed)
        masked = seg.clone()
        masked[[k for k in range(len(restricted.classes)) if k not in allowed]] = -torch.inf
        np.testing.assert_array_equal(result.mask, masked.argmax(0).numpy())


class FullWidthTensors(TorchDispatchMode):
    """Records the (rows, columns) of every float tensor an op returns whose last dimension is ``width`` (a map at
    the image's own width: a band, or the whole image). The uint8 masks are left out: they are whole on the device
    as on the host (one byte a pixel, the batch's one copy)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.width, self.sizes = width, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dim() >= 2 and t.shape[-1] == self.width:
                self.sizes.append(tuple(t.shape[-2:]))
        return out


def test_a_huge_image_is_brought_back_in_bands_within_the_pixel_budget(toy_checkpoint, tmp_path):
    """An image far over max_size**2 pixels: no float tensor at the image's width, in the model input made from it nor
    in the mask, CAMs, probabilities, overlays and logits brought back to its size, holds more rows than a band of
    max_size**2 pixels allows (the Segmenter and run_inference alike); the outputs cover every row."""
    from wsss.inference.folder.runner import InferenceOptions, run_inference
    from wsss.utils.fileio import read_image, read_mask, save_image

    root, ckpt = toy_checkpoint
    small = Image.open(root / "JPEGImages" / "val_00000.jpg")
    height, width, max_size = 900, 701, 64
    path = tmp_path / "in" / "huge.png"
    path.parent.mkdir()
    save_image(path, np.asarray(small.resize((width, height))))
    raw = read_image(path)
    budget_rows = max_size**2 // width  # 5 rows of 701 pixels: 3505 <= 4096
    segmenter = Segmenter.from_checkpoint(ckpt, "cpu")
    with FullWidthTensors(width) as seen:
        result = segmenter(raw, scales=(1.0, 0.5), flip=True, max_size=max_size, cams=True)
        every_class = torch.ones(len(segmenter.classes), dtype=torch.bool)
        probs = segmenter.run_batch([raw], (1.0,), False, max_size).probabilities(0, every_class)  # the CRF's input
    assert result.mask.shape == (height, width) and probs.shape[1:] == (height, width) and result.cams
    assert seen.sizes and max(rows for rows, _ in seen.sizes) == budget_rows
    opts = InferenceOptions(scales=(1.0,), flip=False, overlay=True, cams=True, logits=True, max_size=max_size,
                            num_workers=0, progress=False)  # fmt: skip
    with FullWidthTensors(width) as seen:
        summary = run_inference(ckpt, path.parent, tmp_path / "out", options=opts)
    assert summary.done == 1 and read_mask(tmp_path / "out" / "masks" / "huge.png").shape == (height, width)
    assert seen.sizes and max(rows for rows, _ in seen.sizes) == budget_rows


@pytest.mark.parametrize("antialias", [False, True])
@pytest.mark.parametrize(("size_in", "size_out"), [(300, 77), (41, 600), (513, 513)])
def test_an_interpolation_matrix_resizes_as_interpolate(size_in, size_out, antialias):
    """Its product with a signal equals ``F.interpolate`` of it, down, up and the same, past the 256 unit vectors
    resized per call (columns of a second and third chunk)."""
    signal = torch.randn(3, 1, 1, size_in, generator=torch.Generator().manual_seed(size_in))
    matrix = interpolation_matrix(size_in, size_out, antialias, torch.device("cpu"))
    assert matrix.shape == (size_out, size_in) and matrix.dtype == torch.float32
    want = F.interpolate(signal, size=(1, size_out), mode="bilinear", align_corners=False, antialias=antialias)
    torch.testing.assert_close(signal[:, 0, 0] @ matrix.T, want[:, 0, 0], rtol=1e-5, atol=1e-5)
