"""Checkpoint files given to the tools: a .safetensors export is read where a model is all a tool needs, and every
file a tool cannot read gives one ``error:`` line naming it, never torch's advice to load it unsafely."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from tests.conftest import tiny_config
from tools import eval_cams as eval_cams_cli
from tools import export as export_cli
from tools import test as test_cli
from wsss.config import dump_config
from wsss.engine.train import train
from wsss.model_file import read_model_file

pytestmark = pytest.mark.usefixtures("one_thread")

UNSAFE_HINT = "weights_only"
"""Part of torch's hint "Re-running torch.load with weights_only set to False will likely succeed"."""


@pytest.fixture
def trained(tiny_voc: Path, tmp_path: Path) -> tuple[Path, Path, Path]:
    """(config file, checkpoint, its tools/export.py --safetensors export) of a tiny ViT trained for 3 iterations."""
    cfg = tiny_config(tiny_voc, max_iters=3)
    cfg_file = tmp_path / "cfg.py"
    dump_config(cfg, cfg_file)
    ckpt = train(cfg, work_dir=tmp_path / "work", device="cpu").checkpoint
    export = tmp_path / "model.safetensors"
    assert export_cli.main([str(ckpt), "--safetensors", str(export)]) == 0
    return cfg_file, ckpt, export


def error_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]


def test_test_and_export_read_a_safetensors_export(trained, tmp_path, capsys):
    cfg_file, ckpt, export = trained
    for name, model_file in (("pth", ckpt), ("st", export)):
        args = [str(cfg_file), str(model_file), "--work-dir", str(tmp_path / name), "--device", "cpu"]
        assert test_cli.main(args) == 0
    scores = [json.loads((tmp_path / d / f"test_{stem}" / "metrics.json").read_text())
              for d, stem in (("pth", ckpt.stem), ("st", export.stem))]  # fmt: skip
    assert scores[0]["mIoU"] == scores[1]["mIoU"] and scores[1]["checkpoint"] == str(export)
    again = tmp_path / "again.safetensors"
    assert export_cli.main([str(export), "--safetensors", str(again)]) == 0
    assert load_file(again).keys() == load_file(export).keys()
    capsys.readouterr()
    rc = export_cli.main([str(export), "--onnx", str(tmp_path / "m.onnx")])
    err = capsys.readouterr().err
    assert UNSAFE_HINT not in err and (rc == 0 or err.startswith("error: ONNX export needs"))


def test_onnx_export_of_a_safetensors_export(trained, tmp_path):
    pytest.importorskip("onnx")
    pytest.importorskip("onnxscript")
    _, ckpt, export = trained
    for source in (ckpt, export):
        assert export_cli.main([str(source), "--onnx", str(tmp_path / f"{source.suffix[1:]}.onnx")]) == 0
    assert (tmp_path / "pth.onnx").read_bytes() == (tmp_path / "safetensors.onnx").read_bytes()


def test_eval_cams_reads_a_safetensors_export(trained, tmp_path, capsys):
    _, ckpt, export = trained
    reports = []
    for name, model_file in (("pth", ckpt), ("st", export)):
        out = tmp_path / f"cams_{name}"
        args = [str(model_file), "--bg-thresholds", "0.3,0.5", "--pseudo", "--out", str(out), "--no-progress"]
        assert eval_cams_cli.main(args) == 0, capsys.readouterr().err
        reports.append(json.loads((out / "cam_eval.json").read_text()))
    assert reports[1]["checkpoint"] == str(export)
    for key in ("cam_sweep", "best", "pseudo_certain_pixels", "pseudo_every_pixel", "num_images"):
        assert reports[0][key] == reports[1][key], key


def test_a_malformed_export_is_named(trained, tmp_path, capsys):
    cfg_file, _, export = trained
    from safetensors import safe_open

    with safe_open(str(export), framework="pt") as f:
        metadata = {**f.metadata(), "config": ""}
    bad = tmp_path / "bad.safetensors"
    save_file(load_file(export), bad, metadata=metadata)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(bad))}: its metadata 'config' is missing or not JSON"):
        read_model_file(bad)
    assert test_cli.main([str(cfg_file), str(bad), "--work-dir", str(tmp_path / "o"), "--device", "cpu"]) == 2
    assert export_cli.main([str(bad), "--safetensors", str(tmp_path / "x.safetensors")]) == 2
    assert eval_cams_cli.main([str(bad), "--out", str(tmp_path / "c"), "--no-progress"]) == 2
    errors = error_lines(capsys)
    assert len(errors) == 3 and all(e.startswith(f"error: {bad}: ") and "config" in e for e in errors), errors


def test_files_that_are_no_checkpoint_give_one_line_without_the_unsafe_hint(trained, tmp_path, capsys):
    import torch

    cfg_file, _, _ = trained
    module = tmp_path / "module.pth"
    torch.save(torch.nn.Linear(2, 2), module)  # a whole module: loading it would need its code
    text = tmp_path / "notes.pth"
    text.write_text("hello")
    for path in (module, text):
        assert test_cli.main([str(cfg_file), str(path), "--work-dir", str(tmp_path / "o"), "--device", "cpu"]) == 2
        assert export_cli.main([str(path), "--onnx", str(tmp_path / "m.onnx")]) == 2
        assert eval_cams_cli.main([str(path), "--out", str(tmp_path / "c"), "--no-progress"]) == 2
        out = capsys.readouterr().err
        errors = [line for line in out.splitlines() if line.startswith("error:")]
        assert UNSAFE_HINT not in out and len(errors) == 3, out
        assert all(e.startswith(f"error: {path}: ") and "not a wsss checkpoint" in e for e in errors)
