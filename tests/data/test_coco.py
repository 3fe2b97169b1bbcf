"""COCO 2014 conversion on a hand-written COCO-format JSON: polygons, both RLE forms, crowd, overlaps."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tools import convert_coco as convert_coco_cli
from wsss.data.labels import load_labels
from wsss.utils.fileio import read_mask

mask_utils = pytest.importorskip("pycocotools.mask")

H, W = 12, 16
CATEGORIES = [{"id": 1, "name": "person"}, {"id": 3, "name": "car"}, {"id": 7, "name": "dog"}]
CLASSES = ["background", "person", "car", "dog"]  # COCO category ids 1, 3, 7 -> class indices 1, 2, 3


def box(y0: int, y1: int, x0: int, x1: int) -> np.ndarray:
    m = np.zeros((H, W), dtype=np.uint8)
    m[y0:y1, x0:x1] = 1
    return m


def uncompressed_rle(m: np.ndarray) -> dict:
    """COCO's ``counts`` list: run lengths of the column-major flattening, starting with zeros."""
    flat = m.flatten(order="F")
    changes = np.flatnonzero(np.diff(np.concatenate([[0], flat, [1 - flat[-1]]])))
    return {"size": [H, W], "counts": np.diff(np.concatenate([[0], changes])).tolist()}


def compressed_rle(m: np.ndarray) -> dict:
    rle = mask_utils.encode(np.asfortranarray(m))
    return {"size": rle["size"], "counts": rle["counts"].decode()}


def write_coco(root: Path) -> None:
    # train image 1: a person polygon (x 2..8, y 2..8), a car as uncompressed RLE overlapping it (rows 5-9,
    # cols 6-11), a second person as compressed RLE overlapping the first (rows 1-3, cols 3-6: same class, no
    # conflict), and a crowd of dogs (rows 9-11, cols 0-3) as RLE. Image 2 has no annotation.
    person = [[2.0, 2.0, 8.0, 2.0, 8.0, 8.0, 2.0, 8.0]]
    anns = [
        {"id": 1, "image_id": 1, "category_id": 1, "iscrowd": 0, "segmentation": person},
        {"id": 2, "image_id": 1, "category_id": 3, "iscrowd": 0, "segmentation": uncompressed_rle(box(5, 10, 6, 12))},
        {"id": 3, "image_id": 1, "category_id": 1, "iscrowd": 0, "segmentation": compressed_rle(box(1, 4, 3, 7))},
        {"id": 4, "image_id": 1, "category_id": 7, "iscrowd": 1, "segmentation": uncompressed_rle(box(9, 12, 0, 4))},
    ]
    train = {
        "images": [
            {"id": 1, "file_name": "COCO_train2014_000000000001.jpg", "height": H, "width": W},
            {"id": 2, "file_name": "COCO_train2014_000000000002.jpg", "height": H, "width": W},
        ],
        "annotations": anns,
        "categories": CATEGORIES,
    }
    val = {
        "images": [
            {"id": 5, "file_name": "COCO_val2014_000000000005.jpg", "height": H, "width": W},
            {"id": 9, "file_name": "COCO_val2014_000000000009.jpg", "height": H, "width": W},
        ],
        "annotations": [
            {"id": 10, "image_id": 9, "category_id": 7, "iscrowd": 0, "segmentation": compressed_rle(box(0, 4, 0, 4))},
            {"id": 11, "image_id": 5, "category_id": 3, "iscrowd": 0, "segmentation": compressed_rle(box(0, 2, 0, 2))},
        ],
        "categories": CATEGORIES,
    }
    (root / "annotations").mkdir(parents=True)
    (root / "annotations" / "instances_train2014.json").write_text(json.dumps(train))
    (root / "annotations" / "instances_val2014.json").write_text(json.dumps(val))


def test_masks_labels_and_splits(tmp_path, capsys):
    write_coco(tmp_path)
    assert convert_coco_cli.main([str(tmp_path), "--val-part", "1"]) == 0
    assert "wrote 3 masks (0 existed)" in capsys.readouterr().out

    mask = read_mask(tmp_path / "SegmentationClass" / "train2014" / "COCO_train2014_000000000001.png")
    assert mask.shape == (H, W)
    assert mask[3, 3] == 1  # inside the polygon only
    assert mask[2, 5] == 1 and mask[1, 4] == 1  # both persons, and the second person alone: same class
    assert mask[6, 7] == 255  # person polygon and car RLE overlap
    assert mask[9, 8] == 2 and mask[6, 10] == 2  # the car alone (class index 2 for COCO category id 3)
    assert (mask[9:, :4] == 255).all()  # crowd region
    assert mask[0, 0] == 0 and mask[11, 15] == 0 and mask[5, 14] == 0  # background
    assert set(np.unique(mask).tolist()) == {0, 1, 2, 255}

    val = read_mask(tmp_path / "SegmentationClass" / "val2014" / "COCO_val2014_000000000009.png")
    assert (val[:4, :4] == 3).all() and (val[4:] == 0).all() and (val[:, 4:] == 0).all()

    sets = tmp_path / "ImageSets" / "Segmentation"
    assert (sets / "train.txt").read_text() == "train2014/COCO_train2014_000000000001\n"  # image 2: no annotation
    assert (sets / "val.txt").read_text().split() == [
        "val2014/COCO_val2014_000000000005", "val2014/COCO_val2014_000000000009"
    ]
    assert (sets / "val_part.txt").read_text().split() == ["val2014/COCO_val2014_000000000005"]
    assert (tmp_path / "classes.txt").read_text().split("\n")[:4] == CLASSES
    labels = load_labels(tmp_path / "cls_labels.json", CLASSES)
    assert labels["train2014/COCO_train2014_000000000001"].tolist() == [1, 1, 1]  # the crowd's dog counts
    assert labels["val2014/COCO_val2014_000000000005"].tolist() == [0, 1, 0]


def test_resumes_and_keeps_other_split_labels(tmp_path, capsys):
    write_coco(tmp_path)
    assert convert_coco_cli.main([str(tmp_path)]) == 0
    path = tmp_path / "SegmentationClass" / "train2014" / "COCO_train2014_000000000001.png"
    stamp = path.stat().st_mtime_ns
    capsys.readouterr()
    assert convert_coco_cli.main([str(tmp_path), "--splits", "train"]) == 0
    assert "wrote 0 masks (1 existed)" in capsys.readouterr().out
    assert path.stat().st_mtime_ns == stamp
    labels = load_labels(tmp_path / "cls_labels.json", CLASSES)
    assert len(labels) == 3  # the val labels of the first run are kept


def test_missing_annotations_is_a_clear_error(tmp_path, capsys):
    assert convert_coco_cli.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "instances_train2014.json not found" in err
