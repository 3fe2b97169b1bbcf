"""The Python predictor: named results equal to an independent TTA computation, options, one path with the CLI."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tools import infer as infer_cli
from wsss.data.transforms import normalize
from wsss.engine.checkpoint import config_from_checkpoint, load_checkpoint, model_from_checkpoint
from wsss.inference.crf import crf_labels
from wsss.inference.predictor import Segmenter
from wsss.models.tta import tta_forward
from wsss.utils.fileio import read_image, read_mask

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def segmenter(toy_checkpoint):
    return Segmenter.from_checkpoint(toy_checkpoint[1], device="cpu")


def reference(ckpt_path, raw, scales, flip):
    """TTA outputs computed without the predictor: the checkpoint's model, normalise, tta_forward."""
    model, ckpt = model_from_checkpoint(ckpt_path)
    x = normalize(raw, tuple(ckpt["mean"]), tuple(ckpt["std"]))[None]
    return tta_forward(model, x, scales, flip, cams=True)


def test_named_results_match_the_tta_reference(toy_checkpoint, segmenter):
    root, ckpt_path = toy_checkpoint
    path = root / "JPEGImages" / "val_00000.jpg"
    raw = read_image(path)
    cfg = load_checkpoint(ckpt_path)["config"]["infer"]
    ref = reference(ckpt_path, raw, cfg["scales"], cfg["flip"])
    result = segmenter(path, cams=True)
    assert result.mask.shape == raw.shape[:2] and result.mask.dtype == np.uint8
    np.testing.assert_array_equal(result.mask, ref.seg[0].argmax(0).numpy())
    probs = ref.cls_logits[0].sigmoid().tolist()
    assert list(result.class_probs) == segmenter.classes[1:] == result.classes[1:]
    np.testing.assert_allclose(list(result.class_probs.values()), probs, rtol=1e-6)
    assert result.present == [n for n, p in zip(segmenter.classes[1:], probs, strict=True) if p > cfg["cls_thresh"]]
    shown = result.present or [max(result.class_probs, key=result.class_probs.get)]
    assert sorted(result.cams) == sorted(shown)
    for name, cam in result.cams.items():
        np.testing.assert_allclose(cam, ref.cam[0, segmenter.classes.index(name) - 1].numpy(), atol=1e-6)
    array_result = segmenter(raw)  # an array gives what its file gives; no CAMs unless asked
    np.testing.assert_array_equal(array_result.mask, result.mask)
    assert array_result.cams is None


def test_scales_flip_and_max_size(toy_checkpoint, segmenter):
    root, ckpt_path = toy_checkpoint
    raw = read_image(root / "JPEGImages" / "val_00001.jpg")
    single = segmenter.forward([raw], scales=(1.0,), flip=False)
    ref = reference(ckpt_path, raw, (1.0,), False)
    torch.testing.assert_close(single.seg, ref.seg)
    assert not torch.allclose(segmenter.forward([raw], scales=(1.0, 0.5), flip=True).seg, single.seg)

    h, w = raw.shape[:2]
    limit = max(h, w) // 2
    small = segmenter.forward([raw], scales=(1.0,), flip=False, max_size=limit)
    assert small.seg.shape[-2:] == (h, w)
    model, ckpt = model_from_checkpoint(ckpt_path)
    x = normalize(raw, tuple(ckpt["mean"]), tuple(ckpt["std"]))[None]
    size = (round(h * limit / max(h, w)), round(w * limit / max(h, w)))
    x = F.interpolate(x, size=size, mode="bilinear", align_corners=False, antialias=True)
    expected = F.interpolate(tta_forward(model, x, (1.0,), False).seg, size=(h, w), mode="bilinear",
                             align_corners=False)  # fmt: skip
    torch.testing.assert_close(small.seg, expected)
    assert not torch.allclose(small.seg, single.seg)
    assert segmenter(raw, max_size=limit).mask.shape == (h, w)
    torch.testing.assert_close(segmenter.forward([raw], scales=(1.0,), flip=False, max_size=max(h, w)).seg, single.seg)


def test_crf_refines_the_mask(toy_checkpoint, segmenter):
    pytest.importorskip("pydensecrf.densecrf")
    raw = read_image(toy_checkpoint[0] / "JPEGImages" / "val_00000.jpg")
    plain, refined = segmenter(raw), segmenter(raw, crf=True)
    assert refined.mask.shape == plain.mask.shape and refined.mask.max() < len(segmenter.classes)
    assert refined.class_probs == plain.class_probs


def test_crf_takes_an_array_in_any_memory_layout(toy_checkpoint, segmenter):
    """The CRF mask is that of the reference's probabilities on the RGB image, also for an array that is a view (the
    RGB view of a BGR array as OpenCV reads it, a mirror): pydensecrf itself refuses non-contiguous arrays."""
    pytest.importorskip("pydensecrf.densecrf")
    root, ckpt_path = toy_checkpoint
    raw = read_image(root / "JPEGImages" / "val_00000.jpg")
    cfg = config_from_checkpoint(load_checkpoint(ckpt_path)).infer
    probs = reference(ckpt_path, raw, cfg.scales, cfg.flip).seg[0].softmax(dim=0).numpy()
    expected = segmenter(raw, crf=True).mask
    np.testing.assert_array_equal(expected, crf_labels(raw, probs, cfg.crf))
    rgb_view = np.ascontiguousarray(raw[..., ::-1])[..., ::-1]
    mirror = raw[:, ::-1]
    assert not rgb_view.flags.c_contiguous and not mirror.flags.c_contiguous
    np.testing.assert_array_equal(segmenter(rgb_view, crf=True).mask, expected)
    np.testing.assert_array_equal(segmenter(mirror, crf=True).mask, segmenter(mirror.copy(), crf=True).mask)


def test_bad_input_is_named(segmenter, tmp_path):
    with pytest.raises(ValueError, match="expected an \\(H, W, 3\\) uint8 RGB image, got float32"):
        segmenter(np.zeros((8, 8, 3), np.float32))
    (tmp_path / "bad.jpg").write_bytes(b"not an image")
    with pytest.raises(ValueError, match="bad.jpg"):
        segmenter(tmp_path / "bad.jpg")


def test_cli_runs_the_predictor_with_max_size(toy_checkpoint, segmenter, tmp_path):
    root, ckpt_path = toy_checkpoint
    inp = tmp_path / "in"
    (inp / "sub").mkdir(parents=True)
    shutil.copy(root / "JPEGImages" / "val_00001.jpg", inp / "sub" / "x.jpg")
    raw = read_image(inp / "sub" / "x.jpg")
    limit = max(raw.shape[:2]) // 2
    argv = [str(ckpt_path), str(inp), str(tmp_path / "out"), "--max-size", str(limit), "--scales", "1.0", "0.5",
            "--no-flip", "--workers", "0", "--no-progress"]  # fmt: skip
    assert infer_cli.main(argv) == 0
    mask = read_mask(tmp_path / "out" / "masks" / "sub" / "x.png")
    np.testing.assert_array_equal(mask, segmenter(raw, scales=(1.0, 0.5), flip=False, max_size=limit).mask)
    assert json.loads((tmp_path / "out" / "run.json").read_text())["max_size"] == limit
