"""Outputs brought to full size a band of rows at a time (the memory bound of huge images) equal the whole-image
computation, and the mask holds the classes ``infer.mask_classes`` allows."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from wsss.config import InferConfig
from wsss.data.transforms import normalize
from wsss.inference.predictor import Prediction, Segmenter, row_bands
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
    pred = Prediction(TTAOutput(seg=seg, cls_logits=torch.zeros(2, 4), cam=cam), SIZE, band_pixels)
    keep = torch.tensor([True, False, True, True, False])
    index = np.flatnonzero(keep.numpy())
    for i in range(2):
        np.testing.assert_array_equal(pred.mask(i, torch.ones(5, dtype=torch.bool)), full(seg)[i].argmax(0).numpy())
        np.testing.assert_array_equal(pred.mask(i, keep), index[full(seg)[i, index].argmax(0).numpy()])
        np.testing.assert_allclose(pred.probabilities(i, keep), full(seg)[i, index].softmax(0).numpy(), atol=1e-6)
        chosen = torch.tensor([False, True, True, False])
        bands = list(pred.cams(i, chosen))
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
