"""The Python predictor: named results equal to an independent TTA computation, options, one path with the CLI."""

from __future__ import annotations

import dataclasses
import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.conftest import MODEL_PRECISIONS, expected_precision, model_precision_seen, record_at_calls
from tests.fake_cuda import fake_cuda, needs_fake_cuda
from tools import infer as infer_cli
from wsss.data.transforms import normalize
from wsss.inference import predictor
from wsss.inference.crf import crf_labels
from wsss.inference.predictor import Segmenter
from wsss.model_file import config_from_checkpoint, load_checkpoint, model_from_checkpoint
from wsss.models.tta import TTAOutput, tta_forward
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


def restricted_argmax(seg, cls_logits, threshold):
    """The mask of infer.mask_classes="present", computed independently: the absent classes' logits set to -inf,
    the present ones those whose sigmoid passes ``threshold``, else the top-1."""
    present = cls_logits.sigmoid() > threshold
    if not present.any():
        present[cls_logits.argmax()] = True
    allowed = torch.cat([torch.ones(1, dtype=torch.bool), present])
    return seg.masked_fill(~allowed[:, None, None], -torch.inf).argmax(0).numpy()


def test_named_results_match_the_tta_reference(toy_checkpoint, segmenter):
    root, ckpt_path = toy_checkpoint
    path = root / "JPEGImages" / "val_00000.jpg"
    raw = read_image(path)
    cfg = load_checkpoint(ckpt_path)["config"]["infer"]
    ref = reference(ckpt_path, raw, cfg["scales"], cfg["flip"])
    result = segmenter(path, cams=True)
    assert result.mask.shape == raw.shape[:2] and result.mask.dtype == np.uint8
    np.testing.assert_array_equal(result.mask, restricted_argmax(ref.seg[0], ref.cls_logits[0], cfg["cls_thresh"]))
    probs = ref.cls_logits[0].sigmoid().tolist()
    assert list(result.class_probs) == segmenter.classes[1:] == result.classes[1:]
    np.testing.assert_allclose(list(result.class_probs.values()), probs, rtol=1e-6)
    passing = [n for n, p in zip(segmenter.classes[1:], probs, strict=True) if p > cfg["cls_thresh"]]
    assert result.present == (passing or [max(result.class_probs, key=result.class_probs.get)])
    assert result.top1_fallback == (not passing)
    assert {segmenter.classes[k] for k in np.unique(result.mask)} <= {"background", *result.present}
    assert sorted(result.cams) == sorted(result.present)
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
    ref = reference(ckpt_path, raw, cfg.scales, cfg.flip)
    present = ref.cls_logits[0].sigmoid() > cfg.cls_thresh
    if not present.any():
        present[ref.cls_logits[0].argmax()] = True
    index = np.flatnonzero(torch.cat([torch.ones(1, dtype=torch.bool), present]).numpy())
    probs = ref.seg[0][index].softmax(dim=0).numpy()  # the CRF sees the classes the mask may hold
    expected = segmenter(raw, crf=True).mask
    np.testing.assert_array_equal(expected, index[crf_labels(raw, probs, cfg.crf)])
    rgb_view = np.ascontiguousarray(raw[..., ::-1])[..., ::-1]
    mirror = raw[:, ::-1]
    assert not rgb_view.flags.c_contiguous and not mirror.flags.c_contiguous
    np.testing.assert_array_equal(segmenter(rgb_view, crf=True).mask, expected)
    np.testing.assert_array_equal(segmenter(mirror, crf=True).mask, segmenter(mirror.copy(), crf=True).mask)


def test_every_common_image_kind_gives_the_mask_of_its_rgb_array(toy_checkpoint, segmenter, tmp_path):
    """Grayscale (H, W) and (H, W, 1), RGBA, a PIL image (without the "not writable" warning), a non-contiguous view
    and a read-only array each give the mask of the RGB array a file of that kind reads as."""
    from PIL import Image

    raw = read_image(toy_checkpoint[0] / "JPEGImages" / "val_00000.jpg")
    gray = raw[..., 1].copy()
    Image.fromarray(gray).save(tmp_path / "gray.png")
    rgba = np.concatenate([raw, np.full(raw.shape[:2] + (1,), 128, np.uint8)], axis=2)
    Image.fromarray(rgba, "RGBA").save(tmp_path / "rgba.png")
    expected_gray = segmenter(tmp_path / "gray.png").mask
    np.testing.assert_array_equal(segmenter(gray).mask, expected_gray)
    np.testing.assert_array_equal(segmenter(gray[..., None]).mask, expected_gray)
    np.testing.assert_array_equal(segmenter(rgba).mask, segmenter(tmp_path / "rgba.png").mask)
    np.testing.assert_array_equal(segmenter(rgba).mask, segmenter(np.round(raw * (128 / 255)).astype(np.uint8)).mask)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns "The given NumPy array is not writable" on a PIL buffer
        np.testing.assert_array_equal(segmenter(Image.fromarray(raw)).mask, segmenter(raw).mask)
        np.testing.assert_array_equal(segmenter(Image.open(tmp_path / "gray.png")).mask, expected_gray)
        read_only = raw.copy()
        read_only.flags.writeable = False
        np.testing.assert_array_equal(segmenter(read_only).mask, segmenter(raw).mask)
    wide = np.zeros((raw.shape[0], raw.shape[1] * 2, 3), np.uint8)
    wide[:, ::2] = raw
    view = wide[:, ::2]
    assert not view.flags.c_contiguous
    np.testing.assert_array_equal(segmenter(view).mask, segmenter(raw).mask)


@pytest.mark.parametrize(
    ("image", "says"),
    [
        (np.zeros((8, 8, 3), np.float32), r"\(x \* 255\)\.round\(\)\.astype\(np\.uint8\)"),
        (np.zeros((3, 8, 9), np.uint8), r"x\.transpose\(1, 2, 0\)"),
        ([[np.zeros((8, 8, 3), np.uint8)] * 2], r"one image or a flat list of images"),
        (np.zeros((8, 8, 2), np.uint8), r"\(H, W, 4\) RGBA uint8 image, got shape \(8, 8, 2\)"),
        (np.zeros((8, 8, 3), np.uint16), r"got uint16 .* x\.astype\(np\.uint8\)"),
        (torch.zeros(8, 8, 3, dtype=torch.uint8), r"image\.cpu\(\)\.numpy\(\)"),
    ],
    ids=["float", "channels-first", "nested-list", "two-channels", "uint16", "tensor"],
)
def test_an_array_of_another_kind_is_refused_with_its_conversion(segmenter, image, says):
    with pytest.raises(ValueError, match=says):
        segmenter(image)


def test_a_missing_or_unreadable_file_is_named(segmenter, tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.jpg"):
        segmenter(tmp_path / "missing.jpg")
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


def test_predict_gives_one_result_per_image_as_numpy(toy_checkpoint, segmenter):
    """One image in, one result out; a list in (paths, PIL images, arrays of mixed sizes), a list out in its order,
    each result the one its image gives alone (batched or not), with numpy mask, scores and present ids."""
    from PIL import Image

    root, _ = toy_checkpoint
    paths = [root / "JPEGImages" / f"val_0000{i}.jpg" for i in (0, 1)]
    a, b = read_image(paths[0]), read_image(paths[1])
    assert a.shape != b.shape
    single = segmenter.predict(a, cams=True)
    assert not isinstance(single, list) and segmenter(a, cams=True).scores.tolist() == single.scores.tolist()
    assert isinstance(single.mask, np.ndarray) and single.mask.dtype == np.uint8 and single.mask.shape == a.shape[:2]
    assert isinstance(single.scores, np.ndarray) and single.scores.dtype == np.float32
    assert single.scores.shape == (len(segmenter.classes) - 1,)
    assert isinstance(single.present_ids, np.ndarray) and single.present_ids.dtype == np.int64
    assert single.present_ids.tolist() == sorted(segmenter.classes.index(n) for n in single.present)
    assert single.present == [segmenter.classes[k] for k in single.present_ids]
    assert single.class_probs == dict(zip(segmenter.classes[1:], single.scores.tolist(), strict=True))
    assert set(np.unique(single.mask).tolist()) <= {0, *single.present_ids.tolist()}
    alone_b = segmenter(b, cams=True)
    inputs = [paths[0], Image.open(paths[1]), a, b, a.copy()]
    for batch_size in (1, 2):
        results = segmenter.predict(inputs, cams=True, batch_size=batch_size)
        assert isinstance(results, list) and len(results) == len(inputs)
        for result, expected in zip(results, [single, alone_b, single, alone_b, single], strict=True):
            np.testing.assert_array_equal(result.mask, expected.mask)
            np.testing.assert_allclose(result.scores, expected.scores, rtol=1e-5)
            np.testing.assert_array_equal(result.present_ids, expected.present_ids)
            assert result.cams.keys() == expected.cams.keys()
    assert segmenter.predict([]) == []


def test_predict_batches_consecutive_images_of_one_size(toy_checkpoint, segmenter, monkeypatch):
    """batch_size=2 on sizes A A A B B A: forward batches of 2, 1, 2, 1 images; the results those of batch 1."""
    root, _ = toy_checkpoint
    a, b = read_image(root / "JPEGImages" / "val_00000.jpg"), read_image(root / "JPEGImages" / "val_00001.jpg")
    alone = {a.shape: segmenter(a, scales=(1.0,), flip=False), b.shape: segmenter(b, scales=(1.0,), flip=False)}
    batches, run_batch = [], segmenter.run_batch

    def counted(images, *args):
        batches.append(len(images))
        return run_batch(images, *args)

    monkeypatch.setattr(segmenter, "run_batch", counted)
    images = [a, a, a, b, b, a]
    results = segmenter.predict(images, scales=(1.0,), flip=False, batch_size=2)
    assert batches == [2, 1, 2, 1]
    for image, result in zip(images, results, strict=True):
        np.testing.assert_array_equal(result.mask, alone[image.shape].mask)
        np.testing.assert_allclose(result.scores, alone[image.shape].scores, rtol=1e-5)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        segmenter.predict([a], batch_size=0)


def test_read_only_arrays_give_no_warning_and_no_copy(toy_checkpoint):
    """np.asarray(PIL image) is read-only: the predictor uses it as it is (no copy) and torch never warns that it is
    not writable, in __call__, a list, with the CRF and in forward. A fresh interpreter, because torch gives that
    warning once per process: an earlier test that raised it would hide it here."""
    code = f"""
import warnings
import numpy as np
from PIL import Image
warnings.simplefilter("error")
from wsss.inference.predictor import Segmenter, as_rgb
segmenter = Segmenter.from_checkpoint({str(toy_checkpoint[1])!r}, device="cpu")
image = np.asarray(Image.open({str(toy_checkpoint[0] / "JPEGImages" / "val_00000.jpg")!r}))
mirror = image[:, ::-1]
assert not image.flags.writeable and not mirror.flags.writeable
segmenter.forward([image], scales=(1.0,), flip=False)
segmenter.predict([image, mirror], scales=(1.0,), flip=False)
segmenter(image, scales=(1.0,), flip=False, crf=True)
print("quiet")
assert as_rgb(image) is image and as_rgb(mirror) is mirror
"""
    import os
    import subprocess
    import sys

    import wsss

    root = str(Path(wsss.__file__).resolve().parents[1])  # the wsss these tests import, not another install
    path = os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "quiet", done.stderr[-2000:]


def test_cli_on_one_image_prints_its_classes_and_scores(toy_checkpoint, tmp_path, capsys):
    """tools/infer.py on one image file names its present classes with their scores (those of labels/), the rule
    that chose them and the three most probable others; again when its outputs exist; a folder run does not. Its
    full-size CAM picture has the legend above the image."""
    import re

    from PIL import Image

    from wsss.inference.folder.visualize import cam_legend

    root, ckpt_path = toy_checkpoint
    image = tmp_path / "photo.jpg"
    shutil.copy(root / "JPEGImages" / "val_00000.jpg", image)
    out = tmp_path / "out"
    base = [str(ckpt_path), str(image), str(out), "--scales", "1.0", "--no-flip", "--cams", "--workers", "0",
            "--no-progress"]  # fmt: skip
    threshold = config_from_checkpoint(load_checkpoint(ckpt_path)).infer.cls_thresh
    strict = ["--overwrite", "--cfg-options", "infer.cls_thresh=1.0"]  # no sigmoid exceeds 1: the top-1 rule
    for extra, thresh in (([], threshold), ([], threshold), (strict, 1.0)):
        assert infer_cli.main([*base, *extra]) == 0  # the second run finds the outputs of the first
        lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("photo.jpg: ")]
        entry = json.loads((out / "labels" / "photo.json").read_text())
        scores = entry["scores"]
        assert entry["top1_fallback"] == (thresh == 1.0 or max(scores.values()) <= thresh)
        rule = f"the most probable: no class scores above {thresh}" if entry["top1_fallback"] else f"score > {thresh}"
        match = re.fullmatch(r"photo\.jpg: present (.*) \((.*)\); next most probable: (.*)", lines[0])
        assert len(lines) == 1 and match and match[2] == rule
        shown = [pair.rsplit(" ", 1) for pair in match[1].split(", ")]
        assert [name for name, _ in shown] == entry["present"]
        assert all(float(value) == round(scores[name], 2) for name, value in shown)
        others = [pair.rsplit(" ", 1) for pair in match[3].split(", ")]
        rest = sorted((n for n in scores if n not in entry["present"]), key=scores.get, reverse=True)
        assert [name for name, _ in others] == rest[:3]
        assert all(float(value) == round(scores[name], 2) for name, value in others)
    # the full-size CAM picture: the image under its legend (whose layout tests/inference/test_visualize.py checks)
    with Image.open(out / "cams" / "photo.jpg") as cam, Image.open(image) as photo:
        width, height = photo.size
        present = entry["present"]
        legend = cam_legend(width, present, [scores[n] for n in present], [(0, 0)] * len(present), [1] * len(present))
        assert cam.size == (width, legend.height + height)
    folder = tmp_path / "folder"
    folder.mkdir()
    shutil.copy(image, folder / "photo.jpg")
    assert infer_cli.main([str(ckpt_path), str(folder), *base[3:]]) == 0
    assert "present" not in capsys.readouterr().out


def class_two_as_top1(classes: int, shown: bool):
    """A stand-in for ``tta_forward``: no class passes 0.5 (class 2 is the most probable, sigmoid 0.27: the top-1
    rule names it), and the background's logit wins every pixel unless ``shown``, where class 2 wins the top half
    (the issue's grayscale photo, whose top-1 class was 0.27 and whose mask was all background)."""

    def forward(model, x, scales, flip, cams=False):
        b, _, h, w = x.shape
        seg = torch.zeros(b, classes, h, w)
        seg[:, 0] = 1.0
        if shown:
            seg[:, 2, : max(1, h // 2)] = 5.0
        cls_logits = torch.full((b, classes - 1), -3.0)
        cls_logits[:, 1] = -1.0
        cam = torch.rand(b, classes - 1, h, w, generator=torch.Generator().manual_seed(0)) if cams else None
        return TTAOutput(seg=seg, cls_logits=cls_logits, cam=cam)

    return forward


@pytest.mark.parametrize("crf", [False, True], ids=["argmax", "crf"])
def test_present_names_only_classes_the_mask_shows(segmenter, monkeypatch, crf):
    """Issue 38, 5.7: a class chosen by the top-1 rule whose logits lose to the background's everywhere was still
    ``present``, had a CAM and was captioned in the gallery, while its mask was empty. ``present`` is the
    classifier's classes that the mask shows, with or without the CRF: the mask, ``present`` and the CAMs agree."""
    from wsss.inference import predictor

    gray = np.full((40, 60, 3), 128, np.uint8)
    monkeypatch.setattr(predictor, "tta_forward", class_two_as_top1(len(segmenter.classes), shown=False))
    result = segmenter.predict(gray, crf=crf, cams=True)
    assert result.top1_fallback and not result.mask.any()
    assert (result.present, result.present_ids.tolist(), result.cams) == ([], [], {})
    monkeypatch.setattr(predictor, "tta_forward", class_two_as_top1(len(segmenter.classes), shown=True))
    result = segmenter.predict(gray, crf=crf, cams=True)
    assert result.top1_fallback and 2 in result.mask and set(np.unique(result.mask).tolist()) <= {0, 2}
    assert result.present == [segmenter.classes[2]] and list(result.cams) == result.present


@needs_fake_cuda
@pytest.mark.parametrize(("mode", "dtype", "device"), MODEL_PRECISIONS)
def test_the_model_runs_with_the_configured_precision(toy_checkpoint, monkeypatch, mode, dtype, device):
    """``infer.fp32_precision`` (the flags a GPU's cuBLAS and cuDNN read) and ``infer.dtype`` (bf16 autocast on a GPU,
    ignored on a CPU) hold while the model runs, not after; the outputs are float32 either way."""
    root, ckpt_path = toy_checkpoint
    infer = config_from_checkpoint(load_checkpoint(ckpt_path)).infer
    infer = dataclasses.replace(infer, fp32_precision=mode, dtype=dtype)
    seen, before = record_at_calls(monkeypatch, predictor, "tta_forward", model_precision_seen), model_precision_seen()
    with fake_cuda():  # CUDA autocast "available" on either device
        segmenter = Segmenter.from_checkpoint(ckpt_path, device=device, infer=infer)
        out = segmenter.forward([read_image(root / "JPEGImages" / "val_00000.jpg")], cams=True)
    assert seen == [expected_precision(mode, dtype, device)] and model_precision_seen() == before
    assert {out.seg.dtype, out.cam.dtype, out.cls_logits.dtype} == {torch.float32}
