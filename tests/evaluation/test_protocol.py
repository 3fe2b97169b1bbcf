"""The protocol line: every setting that changes a score, and whether the split is the full val set."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from wsss.evaluation.protocol import EvalProtocol, run_dir_name


def protocol(**kw) -> EvalProtocol:
    values = {"checkpoint": "w/iter_80000.pth", "step": 80000, "split": "val", "num_images": 1449, "split_images": 1449,
              "val_split": "val", "voc": True, "scales": (1.0, 0.5, 1.5), "flip": True, "crf": True,
              "mask_classes": "present", "max_size": 1024}  # fmt: skip
    return EvalProtocol(**{**values, **kw})


def test_the_line_names_every_setting():
    assert protocol().line() == (
        "protocol: checkpoint iter_80000.pth (step 80000); split val, 1449 of 1449 images: the full VOC val set "
        "(1449 images); scales (1, 0.5, 1.5), flip on, CRF on, mask_classes present, max_size 1024"
    )
    line = protocol(step=None, flip=False, crf=False, mask_classes="all", max_size=0, scales=(1.0,)).line()
    assert "(step unknown)" in line and "scales (1), flip off, CRF off, mask_classes all, max_size uncapped" in line
    assert protocol(max_size=None).line().endswith("mask_classes present")
    assert protocol(fp32_precision="tf32").line().endswith("max_size 1024, float32 products tf32")  # on a GPU
    assert protocol(fp32_precision="tf32", dtype="bfloat16").line().endswith(
        "max_size 1024, model bf16 autocast, float32 products tf32")  # fmt: skip


def test_full_val_on_voc_needs_all_1449_images():
    assert protocol().full_val
    part = protocol(num_images=1000)  # --max-images, or scored on part of the split
    assert not part.full_val and "1000 of 1449 images: NOT the full VOC val set (1449 images)" in part.line()
    trimmed = protocol(num_images=500, split_images=500)  # a val.txt cut to 500 ids: complete, but not VOC val
    assert not trimmed.full_val and "500 of 500 images: NOT the full VOC val set (1449 images)" in trimmed.line()
    assert protocol(split="data/VOC/ImageSets/Segmentation/val.txt").full_val  # the split as a file
    test = protocol(split="test", num_images=1456, split_images=1456, scored=False)
    assert not test.full_val
    assert "1456 of 1456 images: the full VOC test set (1456 images), not scored (--format-only)" in test.line()


def test_full_val_on_other_classes_is_the_whole_val_split():
    toy = protocol(voc=False, num_images=100, split_images=100)
    assert toy.full_val and "split val, 100 of 100 images: the full val split;" in toy.line()
    assert not protocol(voc=False, num_images=99, split_images=100).full_val
    train = protocol(voc=False, split="train", num_images=3, split_images=3)
    assert not train.full_val and "3 of 3 images: all of the split, not the val set" in train.line()
    part = protocol(voc=False, split="train", num_images=2, split_images=3)
    assert "2 of 3 images: a part of the split, not the val set" in part.line()


def test_round_trip_through_json():
    original = protocol(voc=False, num_images=10, scored=False)
    data = json.loads(json.dumps(original.to_dict()))
    assert data["full_val"] is False and data["line"] == original.line()
    assert EvalProtocol.from_dict(data) == original


def test_a_protocol_written_before_max_size_and_scored_is_read_as_scored():
    """Files of older versions record none of the four: every run then was scored and ran its model in float32, and
    its max_size and float32 products are unknown."""
    data = protocol(max_size=1024, fp32_precision="ieee", dtype="bfloat16").to_dict()
    assert (EvalProtocol.from_dict(data).fp32_precision, EvalProtocol.from_dict(data).dtype) == ("ieee", "bfloat16")
    for name in ("max_size", "scored", "fp32_precision", "dtype"):  # as files written before each was recorded
        del data[name]
    assert EvalProtocol.from_dict(data) == protocol(max_size=None, scored=True, fp32_precision=None, dtype="float32")
    del data["split"]
    with pytest.raises(ValueError, match="^protocol without split$"):
        EvalProtocol.from_dict(data)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("split", 5, "protocol 'split' is 5, not str"),
        ("step", True, "protocol 'step' is True, not int | None"),
        ("scales", 1.0, r"protocol 'scales' is 1\.0, not tuple\[float, \.\.\.\]"),
        ("scales", [1.0, "2"], r"protocol 'scales' is \[1\.0, '2'\], not tuple\[float, \.\.\.\]"),
        ("scales", [10**400], r"protocol 'scales' is \[1000.*000\], not tuple\[float, \.\.\.\]"),
        ("crf", "yes", "protocol 'crf' is 'yes', not bool"),
    ],
)
def test_a_protocol_value_of_another_type_is_named(name, value, message):
    """A hand-edited or foreign result file: the report names the field, not a TypeError from deep inside."""
    with pytest.raises(ValueError, match=f"^{message}$"):
        EvalProtocol.from_dict({**protocol().to_dict(), name: value})


def test_the_run_folder_is_named_after_the_splits_stem():
    """A split given as a file names the folder by its stem, as a split given by name does."""
    as_file = run_dir_name("w/iter_5.pth", "data/VOC2012/ImageSets/Segmentation/val.txt", tta=True, crf=False)
    assert as_file == run_dir_name("w/iter_5.pth", "val", tta=True, crf=False) == "test_iter_5_val_tta"
    assert run_dir_name(Path("w/iter_5.pth"), None, tta=False, crf=True) == "test_iter_5_crf"
