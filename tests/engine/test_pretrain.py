"""Classification pre-training: the saved backbone loads strictly through model.pretrained; resume; CLI."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
import torch

from tests.conftest import tiny_config
from tools import pretrain as pretrain_cli
from wsss.data.labels import labels_from_masks, save_labels
from wsss.data.toy.dataset import TOY_CLASSES, make_toy_voc
from wsss.engine import pretrain as pretrain_module
from wsss.engine.pretrain import BACKBONE_FILE, STATE_FILE, ImageClassifier, pretrain
from wsss.models import build_model

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def toy_v3(tmp_path_factory) -> Path:
    """Six train and two val images of toy set version 3, with their image-level labels."""
    root = make_toy_voc(tmp_path_factory.mktemp("toy") / "v3", num_train=6, num_val=2, version=3)
    save_labels(root / "cls_labels.json", labels_from_masks(root / "SegmentationClass", len(TOY_CLASSES)),
                list(TOY_CLASSES))  # fmt: skip
    return root


def _config(root: Path, max_iters: int = 3, **model):
    cfg = tiny_config(root, max_iters=max_iters, batch_size=2, log_interval=1, val_interval=2, ckpt_interval=2)
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, drop_path_rate=0.0, **model))


def test_saved_backbone_loads_strictly_through_model_pretrained(toy_v3, tmp_path, one_thread):
    cfg = _config(toy_v3, freeze_pos_embed=False)
    res = pretrain(cfg, tmp_path / "pre", CPU)
    assert res.checkpoint == tmp_path / "pre" / BACKBONE_FILE and res.step == 3
    assert [h["step"] for h in res.history] == [1, 2, 3]
    assert {"cls_mAP", "cls_F1"} <= set(res.metrics) and 0.0 <= res.metrics["cls_mAP"] <= 100.0
    assert set(res.metrics) - {"cls_mAP", "cls_F1"} <= {f"AP_{name}" for name in TOY_CLASSES[1:]}
    assert not (tmp_path / "pre" / STATE_FILE).exists()  # the resumable state goes once the backbone is saved

    saved = torch.load(res.checkpoint, map_location="cpu", weights_only=True)
    state = saved["state_dict"]
    assert saved["step"] == 3 and saved["classes"] == list(TOY_CLASSES)
    assert saved["config"]["model"]["backbone_kwargs"]["embed_dim"] == 32
    fresh = build_model(cfg.model, num_classes=len(TOY_CLASSES)).backbone.vit.state_dict()
    assert set(state) == set(fresh)  # every backbone key, no head
    assert not torch.equal(state["pos_embed"], fresh["pos_embed"])  # trained: freeze_pos_embed=False honoured

    centered = dataclasses.replace(cfg.model.attention, name="centered")
    wsss_model = dataclasses.replace(cfg.model, pretrained=str(res.checkpoint), attention=centered)
    loaded = build_model(wsss_model, num_classes=len(TOY_CLASSES)).backbone.vit.state_dict()
    for k, v in state.items():
        assert torch.equal(loaded[k], v), k


def test_frozen_pos_embed_stays_and_the_rest_trains(toy_v3, tmp_path, one_thread):
    cfg = _config(toy_v3, freeze_pos_embed=True)
    res = pretrain(cfg, tmp_path / "pre", CPU)
    state = torch.load(res.checkpoint, weights_only=True)["state_dict"]
    torch.manual_seed(cfg.train.seed)
    init = ImageClassifier(cfg, len(TOY_CLASSES) - 1).backbone.vit.state_dict()
    assert torch.equal(state["pos_embed"], init["pos_embed"])
    assert not torch.equal(state["blocks.0.attn.qkv.weight"], init["blocks.0.attn.qkv.weight"])


def test_interrupted_pretraining_resumes_to_the_uninterrupted_weights(toy_v3, tmp_path, monkeypatch, one_thread):
    cfg = _config(toy_v3, max_iters=4, freeze_pos_embed=False)
    whole = torch.load(pretrain(cfg, tmp_path / "whole", CPU).checkpoint, weights_only=True)["state_dict"]

    class Interrupt(Exception):
        pass

    def stop_after_state_saved(obj, path):  # the state at iteration 2 is written, then the run dies
        real_save(obj, path)
        if Path(path).name == STATE_FILE:
            raise Interrupt

    real_save = pretrain_module.atomic_torch_save
    with monkeypatch.context() as patch:
        patch.setattr(pretrain_module, "atomic_torch_save", stop_after_state_saved)
        with pytest.raises(Interrupt):
            pretrain(cfg, tmp_path / "cut", CPU)
    assert not (tmp_path / "cut" / BACKBONE_FILE).exists()
    assert torch.load(tmp_path / "cut" / STATE_FILE, weights_only=True)["step"] == 2

    torch.manual_seed(123)  # the resumed run takes its random state from the file, not from the process
    res = pretrain(cfg, tmp_path / "cut", CPU)
    assert res.step == 4 and [h["step"] for h in res.history] == [3, 4]
    resumed = torch.load(res.checkpoint, weights_only=True)["state_dict"]
    for k, v in whole.items():
        assert torch.equal(resumed[k], v), k


def test_a_backbone_of_another_shape_is_refused(toy_v3, tmp_path, one_thread):
    cfg = _config(toy_v3)
    res = pretrain(cfg, tmp_path / "pre", CPU)
    kwargs = {**cfg.model.backbone_kwargs, "depth": 2}
    other = dataclasses.replace(cfg.model, pretrained=str(res.checkpoint), backbone_kwargs=kwargs)
    with pytest.raises(ValueError, match="unexpected keys"):
        build_model(other, num_classes=len(TOY_CLASSES))


def _cli_config(tmp_path: Path, root: Path) -> Path:
    config = tmp_path / "pre.py"
    config.write_text(
        "_base_ = ['" + str(Path(__file__).resolve().parents[2] / "configs" / "_base_" / "toy.py") + "']\n"
        f"data = dict(root={str(root)!r}, crop_size=32, num_workers=0)\n"
        "model = dict(backbone='vit_tiny_patch16_224', pretrained='', freeze_pos_embed=False,\n"
        "             backbone_kwargs=dict(depth=2, embed_dim=32, num_heads=2, patch_size=8))\n"
        "train = dict(max_iters=2, batch_size=2, log_interval=1, val_interval=100)\n"
    )
    return config


def test_cli(toy_v3, tmp_path, capsys, one_thread):
    config = _cli_config(tmp_path, toy_v3)
    assert pretrain_cli.main([str(config), "--work-dir", str(tmp_path / "w"), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "pre-trained 2 iterations" in out and "cls_mAP" in out
    assert (tmp_path / "w" / BACKBONE_FILE).is_file() and (tmp_path / "w" / "config.py").is_file()


def test_cli_errors_name_the_fix(toy_v3, tmp_path, capsys, one_thread):
    config = _cli_config(tmp_path, toy_v3)
    assert pretrain_cli.main([str(config), "--device", "cpu"]) == 2
    assert "error: no work dir" in capsys.readouterr().err
    big_batch = ["--cfg-options", "train.batch_size=64"]
    assert pretrain_cli.main([str(config), "--work-dir", str(tmp_path / "w"), "--device", "cpu", *big_batch]) == 2
    assert "lower train.batch_size" in capsys.readouterr().err


def test_crop_labels_need_every_training_mask_up_front(toy_v3, tmp_path, capsys, one_thread):
    root = tmp_path / "toy"
    shutil.copytree(toy_v3, root)
    first_train = (root / "ImageSets" / "Segmentation" / "train.txt").read_text().split()[0]
    (root / "SegmentationClass" / f"{first_train}.png").unlink()  # the val masks, which scoring needs, stay
    config = _cli_config(tmp_path, root)
    args = [str(config), "--work-dir", str(tmp_path / "w"), "--device", "cpu", "--cfg-options"]
    assert pretrain_cli.main([*args, "pretrain.labels=image"]) == 0  # image labels need no training mask
    capsys.readouterr()
    assert pretrain_cli.main([*args, "pretrain.labels=crop"]) == 2
    err = capsys.readouterr().err
    assert "1 id(s)" in err and first_train in err and "have no mask in" in err and "data.mask_dir" in err


def test_crop_labels_count_each_class_against_the_whole_crop():
    mask = torch.zeros(3, 10, 10, dtype=torch.long)
    mask[0, :2] = 3  # 20 % of the crop
    mask[0, 5, 5] = 2  # 1 %: below 2 %
    mask[0, 6, :2] = 5  # exactly 2 %: kept
    mask[1] = 255  # ignored pixels count in the crop's area, not as a class
    mask[1, 0, :3] = 6
    mask[2, 0, 0] = 255
    got = pretrain_module.crop_labels(mask, num_classes=7, min_fraction=0.02)
    expected = torch.zeros(3, 6)
    expected[0, [2, 4]] = 1  # classes 3 and 5 -> foreground columns 2 and 4
    expected[1, 5] = 1
    assert torch.equal(got, expected)
    assert torch.equal(pretrain_module.crop_labels(mask, 7, 0.0)[0], torch.tensor([0.0, 1, 1, 0, 1, 0]))


@pytest.mark.parametrize("labels", ["image", "crop"])
def test_targets_are_the_images_or_the_crops_labels(toy_v3, tmp_path, one_thread, monkeypatch, labels):
    cfg = _config(toy_v3, freeze_pos_embed=False)
    cfg = dataclasses.replace(cfg, pretrain=dataclasses.replace(cfg.pretrain, labels=labels))
    seen = []
    real = pretrain_module.multilabel_soft_margin
    monkeypatch.setattr(pretrain_module, "multilabel_soft_margin", lambda x, y: seen.append(y.clone()) or real(x, y))
    res = pretrain(cfg, tmp_path / "pre", CPU)
    assert res.step == 3 and len(seen) == 3 and all(y.shape == (2, len(TOY_CLASSES) - 1) for y in seen)
    # every image holds an object, but some 32 px crops of these 160-320 px images do not
    assert any((y.sum(dim=1) == 0).any() for y in seen) == (labels == "crop")
