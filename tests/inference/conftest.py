"""A tiny model trained on a generated toy set, shared by the predictor and export tests."""

from __future__ import annotations

import pytest

from tests.conftest import tiny_config
from wsss.data.labels import labels_from_masks, save_labels
from wsss.data.toy.dataset import make_toy_voc
from wsss.data.toy.render import TOY_CLASSES
from wsss.engine.train import train


@pytest.fixture(scope="package")
def toy_checkpoint(tmp_path_factory):
    """The toy dataset (6 images) and a tiny ViT trained on it for 4 iterations: (root, checkpoint)."""
    base = tmp_path_factory.mktemp("toy_model")
    root = make_toy_voc(base / "toy", num_train=4, num_val=2)
    save_labels(root / "cls_labels.json", labels_from_masks(root / "SegmentationClass", len(TOY_CLASSES)),
                list(TOY_CLASSES))  # fmt: skip
    cfg = tiny_config(root, max_iters=4, ckpt_interval=4, val_max_images=1)
    return root, train(cfg, work_dir=base / "work", device="cpu").checkpoint
