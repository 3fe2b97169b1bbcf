"""Deployment exports: safetensors with config and classes, ONNX with dynamic size against PyTorch."""

from __future__ import annotations

import errno
import json

import numpy as np
import pytest
import torch

from tools import export as export_cli
from wsss.inference.exports.deploy import SegmentationExport
from wsss.inference.predictor import Segmenter
from wsss.model_file import load_checkpoint, load_safetensors, model_from_checkpoint
from wsss.models.tta import tta_forward
from wsss.utils import fileio
from wsss.utils.fileio import read_image

pytestmark = pytest.mark.usefixtures("one_thread")


def test_safetensors_keeps_config_and_classes(toy_checkpoint, tmp_path):
    root, ckpt_path = toy_checkpoint
    out = tmp_path / "model.safetensors"
    assert export_cli.main([str(ckpt_path), "--safetensors", str(out)]) == 0
    ckpt, exported = load_checkpoint(ckpt_path), load_safetensors(out)
    assert set(exported) == {"model", "config", "classes", "mean", "std", "step", "git_commit"}
    for key in ("classes", "mean", "std", "step", "git_commit"):
        assert exported[key] == ckpt[key]
    assert exported["config"] == json.loads(json.dumps(ckpt["config"]))
    assert all(torch.equal(exported["model"][k], v) for k, v in ckpt["model"].items())
    assert out.stat().st_size < ckpt_path.stat().st_size  # no optimiser state
    raw = read_image(root / "JPEGImages" / "val_00000.jpg")
    a = Segmenter.from_checkpoint(ckpt_path, "cpu")(raw)
    b = Segmenter.from_checkpoint(out, "cpu")(raw)
    np.testing.assert_array_equal(a.mask, b.mask)
    assert a.class_probs == b.class_probs


def test_not_an_export_is_a_clear_error(toy_checkpoint, tmp_path, capsys):
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(2)}, tmp_path / "bare.safetensors")
    with pytest.raises(ValueError, match="not a wsss export"):
        load_safetensors(tmp_path / "bare.safetensors")
    assert export_cli.main([str(tmp_path / "missing.pth"), "--onnx", str(tmp_path / "m.onnx")]) == 2
    assert capsys.readouterr().err.startswith(f"error: checkpoint {tmp_path / 'missing.pth'} not found")


def test_onnx_matches_pytorch_at_any_size(toy_checkpoint, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    _, ckpt_path = toy_checkpoint
    out = tmp_path / "model.onnx"
    assert export_cli.main([str(ckpt_path), "--onnx", str(out)]) == 0
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    meta = session.get_modelmeta().custom_metadata_map
    ckpt = load_checkpoint(ckpt_path)
    assert json.loads(meta["classes"]) == ckpt["classes"] and json.loads(meta["mean"]) == ckpt["mean"]
    model, _ = model_from_checkpoint(ckpt)
    wrapper = SegmentationExport(model).eval()
    gen = torch.Generator().manual_seed(0)
    for shape in ((1, 3, 40, 56), (2, 3, 37, 61), (1, 3, 96, 24)):  # patch 8: multiples and not
        x = torch.randn(shape, generator=gen)
        seg, cls = session.run(["seg", "cls"], {"image": x.numpy()})
        with torch.no_grad():
            ref = tta_forward(model, x, (1.0,), False)
            wrapped = wrapper(x)
        assert seg.shape == (shape[0], len(ckpt["classes"]), *shape[2:])
        torch.testing.assert_close(wrapped[0], ref.seg)  # the exported module is single-scale inference
        np.testing.assert_allclose(seg, ref.seg.numpy(), atol=1e-4, rtol=0)
        np.testing.assert_allclose(cls, ref.cls_logits.numpy(), atol=1e-4, rtol=0)


def test_a_full_disk_names_the_export(toy_checkpoint, tmp_path, monkeypatch, capsys):
    _, ckpt_path = toy_checkpoint
    out = tmp_path / "model.safetensors"

    def disk_full(path, mode="wb"):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fileio, "atomic_open", disk_full)
    assert export_cli.main([str(ckpt_path), "--safetensors", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: cannot write {out}: the disk is full"), err
    assert not out.exists() and not list(tmp_path.iterdir())
