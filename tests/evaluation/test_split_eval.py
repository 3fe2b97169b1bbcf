"""tools/test.py: a checkpoint scored on the config's val split, with mmseg's spelling."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.conftest import tiny_config
from tools import test as test_cli
from wsss.config import dump_config
from wsss.data.transforms import normalize
from wsss.engine.checkpoint import model_from_checkpoint
from wsss.engine.train import train
from wsss.evaluation.metrics import ConfusionMatrix
from wsss.models.tta import tta_forward
from wsss.utils.fileio import read_image, read_mask

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def trained(tiny_voc: Path, tmp_path: Path) -> tuple[Path, Path]:
    """(config file, checkpoint) of a tiny ViT trained for 3 iterations on the tiny dataset."""
    cfg = tiny_config(tiny_voc, max_iters=3)
    cfg.infer.scales = (1.0, 0.5)
    cfg_file = tmp_path / "cfg.py"
    dump_config(cfg, cfg_file)
    return cfg_file, train(cfg, work_dir=tmp_path / "work", device="cpu").checkpoint


def test_scores_the_val_split_at_one_scale(trained, tiny_voc, capsys):
    cfg_file, ckpt = trained
    assert test_cli.main([str(cfg_file), str(ckpt), "--device", "cpu"]) == 0
    out = ckpt.with_name(f"test_{ckpt.stem}")
    assert "mIoU" in capsys.readouterr().out
    assert sorted(p.name for p in (out / "masks").iterdir()) == ["b1.png", "b2.png"]
    assert not (out / "overlays").exists() and not (out / "index.html").exists()
    # the same numbers from the model run by hand: one scale, no flip, argmax
    model, ckpt_data = model_from_checkpoint(ckpt)
    cm = ConfusionMatrix(3)
    for image_id in ("b1", "b2"):
        image = normalize(read_image(tiny_voc / "JPEGImages" / f"{image_id}.jpg"), ckpt_data["mean"], ckpt_data["std"])
        with torch.no_grad():
            seg = tta_forward(model, image[None], scales=(1.0,), flip=False).seg
        pred = read_mask(out / "masks" / f"{image_id}.png")
        assert torch.equal(seg.argmax(1)[0].byte(), torch.from_numpy(pred))
        cm.update(pred, read_mask(tiny_voc / "SegmentationClass" / f"{image_id}.png"))
    expected = cm.compute(["mIoU"], class_names=["background", "cat", "dog"])
    written = json.loads((out / "metrics.json").read_text())
    assert written["mIoU"] == expected.summary["mIoU"] and written["tta"] is False
    run = json.loads((out / "run.json").read_text())
    assert run["scales"] == [1.0] and run["flip"] is False


def test_show_dir_and_tta(trained, tmp_path):
    cfg_file, ckpt = trained
    show = tmp_path / "show"
    assert test_cli.main([str(cfg_file), str(ckpt), "--show-dir", str(show), "--tta", "--device", "cpu"]) == 0
    assert (show / "index.html").is_file() and (show / "overlays" / "b1.jpg").is_file()
    run = json.loads((show / "run.json").read_text())
    assert run["scales"] == [1.0, 0.5] and run["flip"] is True
    assert json.loads((show / "metrics.json").read_text())["tta"] is True
    with pytest.raises(SystemExit):
        test_cli.main([str(cfg_file), str(ckpt), "--show-dir", str(show), "--out", str(show)])


def test_refuses_a_config_of_other_classes(trained, tmp_path, capsys):
    cfg_file, ckpt = trained
    args = [str(cfg_file), str(ckpt), "--out", str(tmp_path / "o"), "--cfg-options", "data.classes=[bg,x,y]"]
    assert test_cli.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "trained on classes ['background', 'cat', 'dog']" in err
    assert not (tmp_path / "o").exists()
