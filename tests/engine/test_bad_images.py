"""An unreadable image never costs training progress: skipped with a warning in training and in validation, the
warnings in log.txt (also from loader worker processes), and the checkpoint saved before validating."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.conftest import tiny_config, tiny_tagged_config
from wsss.data.transforms import backbone_mean_std
from wsss.data.voc import val_dataset
from wsss.engine.train import train
from wsss.engine.validate import validate
from wsss.evaluation.classification import multilabel_scores
from wsss.model_file import load_checkpoint
from wsss.models import build_model

pytestmark = pytest.mark.usefixtures("one_thread")

BAD_VAL = "set2/pets/a1.jpg"
"""One of the 4 images of :func:`tests.conftest.tiny_tagged` that fall in the val part at val_fraction 0.3."""


def make_unreadable(path):
    path.write_text("a text file named like a photo\n")


def test_validation_skips_an_unreadable_image(tiny_tagged):
    cfg = tiny_tagged_config(tiny_tagged)
    mean, std = backbone_mean_std(cfg.model.backbone)
    dataset = val_dataset(cfg.data, mean, std)
    assert BAD_VAL in dataset.ids
    torch.manual_seed(0)
    model = build_model(cfg.model, num_classes=3).eval()
    readable = [i for i, image_id in enumerate(dataset.ids) if image_id != BAD_VAL]
    with torch.no_grad():
        probs = [model(dataset[i]["image"][None]).logits.sigmoid()[0].numpy() for i in readable]
    targets = [dataset[i]["label"].numpy() for i in readable]
    cfg.train.val_input = "original"
    make_unreadable(tiny_tagged / BAD_VAL)

    res = validate(model, dataset, cfg, torch.device("cpu"), num_pictures=0)
    assert len(res.skipped) == 1 and res.skipped[0].startswith(f"{tiny_tagged / BAD_VAL}: not a readable image")
    expected = multilabel_scores(np.stack(probs), np.stack(targets), cfg.infer.cls_thresh, names=dataset.classes[1:])
    assert res.metrics == pytest.approx(expected)

    cfg.data.max_bad_images = 0
    with pytest.raises(ValueError, match=r"1 val images could not be read \(more than data.max_bad_images = 0\)"):
        validate(model, dataset, cfg, torch.device("cpu"))


def test_validation_with_no_readable_image_names_the_split(tiny_voc):
    cfg = tiny_config(tiny_voc)
    mean, std = backbone_mean_std(cfg.model.backbone)
    dataset = val_dataset(cfg.data, mean, std)
    for image_id in dataset.ids:
        make_unreadable(dataset.image_path(image_id))
    model = build_model(cfg.model, num_classes=3)
    with pytest.raises(ValueError, match=r"no image of .*val.txt can be read; run tools/check_dataset.py"):
        validate(model, dataset, cfg, torch.device("cpu"))


def test_an_unreadable_val_image_costs_no_checkpoint(tiny_tagged, tmp_path, capsys):
    """The repro of issue 22: a text file named .jpg in the val part; validation and saving at one interval."""
    make_unreadable(tiny_tagged / BAD_VAL)
    work = tmp_path / "w"
    res = train(tiny_tagged_config(tiny_tagged, max_iters=2, val_interval=2, ckpt_interval=2), work_dir=work,
                device="cpu")  # fmt: skip
    assert res.step == 2 and load_checkpoint(work / "iter_2.pth")["step"] == 2
    warning = f"warning: skipping val image {tiny_tagged / BAD_VAL}: not a readable image"
    assert warning in capsys.readouterr().out
    assert warning in (work / "log.txt").read_text()
    assert set(res.val.metrics) == {"cls_mAP", "cls_F1", "AP_cat", "AP_dog"}


def test_a_failing_validation_keeps_the_checkpoint_before_it(tiny_tagged, tmp_path):
    make_unreadable(tiny_tagged / BAD_VAL)
    cfg = tiny_tagged_config(tiny_tagged, max_iters=4, val_interval=2, ckpt_interval=2)
    cfg.data.max_bad_images = 0
    with pytest.raises(ValueError, match="val images could not be read"):
        train(cfg, work_dir=tmp_path / "w", device="cpu")
    assert load_checkpoint(tmp_path / "w" / "iter_2.pth")["step"] == 2


def test_skipped_training_images_reach_the_log_from_loader_workers(tiny_voc, tmp_path, capfd):
    bad = tiny_voc / "JPEGImages" / "a1.jpg"
    make_unreadable(bad)
    work = tmp_path / "w"
    cfg = tiny_config(tiny_voc)
    cfg.data.num_workers = 2
    res = train(cfg, work_dir=work, device="cpu")
    assert res.step == 6
    warning = f"warning: skipping training image {bad}: not a readable image"
    assert warning in capfd.readouterr().err  # printed by a worker process
    assert warning in (work / "log.txt").read_text()
