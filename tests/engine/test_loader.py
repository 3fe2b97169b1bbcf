"""The training loader (wsss.engine.train.training_batches): its workers start once and live across epochs, and the
epoch travels with every index (wsss.engine.distributed.EpochItems), so they draw each epoch's crops exactly as the
process itself would."""

from __future__ import annotations

import torch

from tests.conftest import tiny_config
from wsss.config import apply_options
from wsss.data.transforms import backbone_mean_std
from wsss.data.voc import VOCClsDataset
from wsss.engine.train import training_batches


def stream(cfg, workers: int, start: int, count: int) -> list[dict]:
    cfg = apply_options(cfg, {"data.num_workers": workers})
    dataset = VOCClsDataset(cfg.data, *backbone_mean_std(cfg.model.backbone), seed=cfg.train.seed)
    data = training_batches(dataset, cfg, start, torch.device("cpu"), 1, 0)
    batches = [next(data) for _ in range(count)]
    data.close()  # the workers stop with the loader
    return batches


def test_workers_living_across_epochs_draw_each_epochs_crops(tiny_voc):
    """6 epochs (3 images, batches of 2: one batch an epoch) with 2 workers started once equal those read in the
    process, bit for bit; an image drawn in two epochs is cropped otherwise in each; a run resumed at iteration 3
    continues the same stream."""
    cfg = tiny_config(tiny_voc)
    in_process, workers = stream(cfg, 0, 0, 6), stream(cfg, 2, 0, 6)
    for a, b in zip(in_process, workers, strict=True):
        assert a["id"] == b["id"] and torch.equal(a["image"], b["image"]) and torch.equal(a["box"], b["box"])
    crops: dict[str, list[torch.Tensor]] = {}
    for batch in workers:
        for image_id, image in zip(batch["id"], batch["image"], strict=True):
            crops.setdefault(image_id, []).append(image)
    drawn_again = [images for images in crops.values() if len(images) > 1]
    assert drawn_again and all(not torch.equal(a, b) for images in drawn_again for a in images for b in images
                               if a is not b)  # fmt: skip
    resumed = stream(cfg, 2, 3, 3)
    for a, b in zip(in_process[3:], resumed, strict=True):
        assert a["id"] == b["id"] and torch.equal(a["image"], b["image"])
