"""tools/test.py: a checkpoint scored on the config's val split, with mmseg's spelling."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import tiny_config
from tools import infer as infer_cli
from tools import test as test_cli
from wsss.config import dump_config
from wsss.engine.train import train
from wsss.evaluation.metrics import ConfusionMatrix
from wsss.inference.predictor import Segmenter
from wsss.utils.fileio import read_mask

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def trained(tiny_voc: Path, tmp_path: Path) -> tuple[Path, Path]:
    """(config file, checkpoint) of a tiny ViT trained for 3 iterations on the tiny dataset."""
    cfg = tiny_config(tiny_voc, max_iters=3)
    cfg.infer.scales = (1.0, 0.5)
    cfg_file = tmp_path / "cfg.py"
    dump_config(cfg, cfg_file)
    return cfg_file, train(cfg, work_dir=tmp_path / "work", device="cpu").checkpoint


def folder_state(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``folder`` with its size and modification time."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


def test_scores_the_val_split_at_one_scale_under_the_work_dir(trained, tiny_voc, tmp_path, monkeypatch, capsys):
    cfg_file, ckpt = trained
    monkeypatch.chdir(tmp_path)
    before = folder_state(ckpt.parent)
    ckpt.parent.chmod(0o555)  # read-only (root writes anyway: the file listing below is what is checked)
    try:
        assert test_cli.main([str(cfg_file), str(ckpt), "--device", "cpu"]) == 0
        assert test_cli.main([str(cfg_file), str(ckpt), "--device", "cpu", "--work-dir", str(tmp_path / "w")]) == 0
    finally:
        ckpt.parent.chmod(0o755)
    assert folder_state(ckpt.parent) == before
    out = tmp_path / "work_dirs" / cfg_file.stem / f"test_{ckpt.stem}"  # mmseg's default work dir
    assert (tmp_path / "w" / f"test_{ckpt.stem}" / "metrics.json").is_file()
    assert "mIoU" in capsys.readouterr().out
    assert sorted(p.name for p in (out / "masks").iterdir()) == ["b1.png", "b2.png"]
    assert not (out / "overlays").exists() and not (out / "index.html").exists()
    # the same masks as the predictor's at one scale without flip, scored by hand
    segmenter = Segmenter.from_checkpoint(ckpt, "cpu")
    cm = ConfusionMatrix(3)
    for image_id in ("b1", "b2"):
        predicted = segmenter(tiny_voc / "JPEGImages" / f"{image_id}.jpg", scales=(1.0,), flip=False).mask
        pred = read_mask(out / "masks" / f"{image_id}.png")
        np.testing.assert_array_equal(pred, predicted)
        cm.update(pred, read_mask(tiny_voc / "SegmentationClass" / f"{image_id}.png"))
    expected = cm.compute(["mIoU"], class_names=["background", "cat", "dog"])
    written = json.loads((out / "metrics.json").read_text())
    assert written["mIoU"] == expected.summary["mIoU"] and written["tta"] is False
    assert written["predictions"] == str(out.relative_to(tmp_path) / "masks")  # as named: relative to the cwd
    run = json.loads((out / "run.json").read_text())
    assert run["scales"] == [1.0] and run["flip"] is False
    assert run["fp32_precision"] is written["protocol"]["fp32_precision"] is None  # a CPU's products are IEEE
    assert "float32" not in written["protocol"]["line"]


def test_the_configs_inference_settings_govern(trained, tmp_path):
    cfg_file, ckpt = trained
    show = tmp_path / "show"
    args = [str(cfg_file), str(ckpt), "--show-dir", str(show), "--work-dir", str(tmp_path / "w"), "--device", "cpu"]
    assert test_cli.main([*args, "--cfg-options", "infer.max_size=16"]) == 0
    assert json.loads((show / "run.json").read_text())["max_size"] == 16


def test_out_and_show_dir_together_with_tta(trained, tmp_path):
    cfg_file, ckpt = trained
    out, show, work = tmp_path / "out", tmp_path / "show", tmp_path / "w"
    args = [str(cfg_file), str(ckpt), "--out", str(out), "--show-dir", str(show), "--work-dir", str(work), "--tta"]
    assert test_cli.main([*args, "--device", "cpu"]) == 0
    # --show-dir: the painted images and their gallery; --out: the predicted masks; the work dir: the scores
    assert (show / "index.html").is_file() and (show / "overlays" / "b1.jpg").is_file()
    assert sorted(p.name for p in (out / "masks").iterdir()) == ["b1.png", "b2.png"]
    for image_id in ("b1", "b2"):
        assert (out / "masks" / f"{image_id}.png").read_bytes() == (show / "masks" / f"{image_id}.png").read_bytes()
    assert not (out / "overlays").exists() and not (out / "index.html").exists()
    run = json.loads((show / "run.json").read_text())
    assert run["scales"] == [1.0, 0.5] and run["flip"] is True
    metrics = json.loads((work / f"test_{ckpt.stem}_tta" / "metrics.json").read_text())
    assert metrics["tta"] is True and metrics["predictions"] == str(out / "masks")
    assert sorted(p.name for p in work.iterdir()) == [f"test_{ckpt.stem}_tta"]


def test_a_second_run_predicts_again(trained, tmp_path):
    """Masks left by a run with other settings are never scored: the TTA run after a single-scale run in the same
    folder predicts every image again."""
    cfg_file, ckpt = trained
    args = [str(cfg_file), str(ckpt), "--out", str(tmp_path / "out"), "--work-dir", str(tmp_path / "w")]
    args += ["--device", "cpu"]
    assert test_cli.main(args) == 0
    assert test_cli.main([*args, "--tta"]) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["done"] == 2 and summary["existing"] == 0


def test_refuses_a_config_of_other_classes(trained, tmp_path, capsys):
    cfg_file, ckpt = trained
    args = [str(cfg_file), str(ckpt), "--out", str(tmp_path / "o"), "--work-dir", str(tmp_path / "w"),
            "--cfg-options", "data.classes=[bg,x,y]"]  # fmt: skip
    assert test_cli.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "trained on classes ['background', 'cat', 'dog']" in err
    assert not (tmp_path / "o").exists() and not (tmp_path / "w").exists()


def test_model_settings_of_the_config_that_the_checkpoint_overrides_are_named(trained, tmp_path, capsys):
    """tools/test.py rebuilds the model from the checkpoint: a config with other model settings (toy_vanilla.py on a
    centered checkpoint) once scored without a word; one warning line now names each setting that is not used."""
    cfg_file, ckpt = trained
    args = [str(cfg_file), str(ckpt), "--device", "cpu", "--work-dir", str(tmp_path / "w")]
    assert test_cli.main(args) == 0
    assert "warning" not in capsys.readouterr().err
    changed = ["model.attention.name=vanilla", "model.decoder_channels=32", "model.drop_path_rate=0.0"]
    assert test_cli.main([*args, "--cfg-options", *changed]) == 0  # drop-path shapes training only: not named
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert warnings == [
        f"warning: the config's model settings differ from those {ckpt} was trained with, and the model is rebuilt "
        "from the checkpoint's: model.attention.name 'vanilla' in the config, 'centered' in the checkpoint; "
        "model.decoder_channels 32 in the config, 16 in the checkpoint"
    ]


def test_a_checkpoint_saved_before_the_decoder_trained_is_named(tiny_voc, tmp_path, capsys):
    """Iteration 2 of a run whose decoder starts at loss.seg_start_iter = 2 (0-based): its masks once came out
    without a word from tools/test.py, tools/infer.py and Segmenter; each now warns once and points to the CAMs."""
    cfg = tiny_config(tiny_voc, max_iters=2, ckpt_interval=2)
    assert cfg.loss.seg_start_iter == 2
    cfg_file = tmp_path / "cfg.py"
    dump_config(cfg, cfg_file)
    ckpt = train(cfg, work_dir=tmp_path / "work", device="cpu").checkpoint
    capsys.readouterr()
    warning = (
        f"warning: {ckpt} holds iterations 0-1 (saved at step 2); its decoder trains from iteration 2 on "
        "(loss.seg_start_iter = 2, 0-based), so no iteration it holds trained the decoder and its masks mean nothing; "
        "use a checkpoint saved at step 3 or later, or its CAMs (tools/infer.py --cams, tools/eval_cams.py)"
    )
    runs = [
        lambda: test_cli.main([str(cfg_file), str(ckpt), "--device", "cpu", "--work-dir", str(tmp_path / "w")]),
        lambda: infer_cli.main([str(ckpt), str(tiny_voc / "JPEGImages"), str(tmp_path / "out"), "--device", "cpu",
                                "--workers", "0", "--no-progress"]),  # fmt: skip
        lambda: Segmenter.from_checkpoint(ckpt, "cpu") and 0,
    ]
    for run in runs:
        assert run() == 0
        assert [line for line in capsys.readouterr().err.splitlines() if "warning" in line] == [warning]
    Segmenter.from_checkpoint(torch.load(ckpt, weights_only=True) | {"step": 3}, "cpu")
    assert "warning" not in capsys.readouterr().err
