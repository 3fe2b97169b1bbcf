from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from tests.conftest import TINY_CLASSES, write_xml
from tools import make_cls_labels
from wsss.data.labels import labels_from_masks, labels_from_xml, load_labels, parse_voc_xml, save_labels


def test_xml_labels_include_difficult(tiny_voc):
    labels = labels_from_xml(tiny_voc / "Annotations", TINY_CLASSES)
    assert labels["a1"].tolist() == [1, 0]
    assert labels["a2"].tolist() == [0, 1]  # the dog is marked difficult and still counts
    assert labels["b1"].tolist() == [1, 1]
    assert labels["b2"].tolist() == [0, 0]


def test_xml_and_masks_agree(tiny_voc):
    a = labels_from_xml(tiny_voc / "Annotations", TINY_CLASSES)
    b = labels_from_masks(tiny_voc / "SegmentationClass", len(TINY_CLASSES))
    assert a.keys() == b.keys()
    assert all((a[k] == b[k]).all() for k in a)


def test_parse_real_voc_style_xml(tmp_path):
    path = tmp_path / "x.xml"
    write_xml(path, "x.jpg", (500, 375), [("person", 0), ("dog", 1), ("person", 0)])
    assert parse_voc_xml(path) == ["person", "dog", "person"]


def test_unknown_class_in_xml_names_file(tiny_voc):
    write_xml(tiny_voc / "Annotations" / "zz.xml", "zz.jpg", (5, 5), [("horse", 0)])
    with pytest.raises(ValueError, match=r"zz.xml.*horse.*--classes"):
        labels_from_xml(tiny_voc / "Annotations", TINY_CLASSES)


def test_broken_xml_names_file(tiny_voc):
    (tiny_voc / "Annotations" / "broken.xml").write_text("<annotation><object>")
    with pytest.raises(ValueError, match="broken.xml"):
        labels_from_xml(tiny_voc / "Annotations", TINY_CLASSES)


def test_mask_value_out_of_range_names_file(tiny_voc):
    from wsss.utils.fileio import save_mask

    save_mask(tiny_voc / "SegmentationClass" / "bad.png", np.full((4, 4), 7, np.uint8))
    with pytest.raises(ValueError, match=r"bad.png.*\[7\]"):
        labels_from_masks(tiny_voc / "SegmentationClass", len(TINY_CLASSES))


def test_label_file_roundtrip_and_class_mismatch(tmp_path):
    labels = {"x": np.array([1, 0], np.uint8), "y": np.array([1, 1], np.uint8)}
    save_labels(tmp_path / "l.json", labels, TINY_CLASSES)
    back = load_labels(tmp_path / "l.json", TINY_CLASSES)
    assert {k: v.tolist() for k, v in back.items()} == {"x": [1, 0], "y": [1, 1]}
    with pytest.raises(ValueError, match="made for classes"):
        load_labels(tmp_path / "l.json", ["background", "cat", "cow"])
    with pytest.raises(FileNotFoundError, match="make_cls_labels"):
        load_labels(tmp_path / "missing.json", TINY_CLASSES)


def test_cli_xml_and_masks(tiny_voc, tmp_path, capsys):
    out = tmp_path / "labels.json"
    assert make_cls_labels.main([str(tiny_voc), "--classes", str(tiny_voc / "classes.txt"), "--out", str(out)]) == 0
    payload = json.loads(out.read_text())
    assert payload["classes"] == TINY_CLASSES and payload["labels"]["b1"] == [1, 1]
    assert "4 images" in capsys.readouterr().out
    out2 = tmp_path / "labels2.json"
    argv = [str(tiny_voc), "--source", "masks", "--mask-dir", "SegmentationClass"]
    assert make_cls_labels.main(argv + ["--classes", str(tiny_voc / "classes.txt"), "--out", str(out2)]) == 0
    assert json.loads(out2.read_text()) == payload


@pytest.mark.parametrize("bad", ["2", "0.5", "-1", "NaN", "true", "null", '"1"'])
def test_label_values_other_than_0_and_1_are_refused(tmp_path, bad):
    path = tmp_path / "l.json"
    path.write_text('{"classes": ["background", "cat", "dog"], "labels": {"x": [1, 0], "img_7": [0, ' + bad + "]}}")
    with pytest.raises(ValueError, match=rf"{path}: label of 'img_7' holds .*only 0 and 1"):
        load_labels(path, TINY_CLASSES)


def test_cli_errors_are_one_line(tmp_path, capsys):
    assert make_cls_labels.main([str(tmp_path), "--out", str(tmp_path / "l.json")]) == 2
    assert capsys.readouterr().err.startswith("error: no annotation XML files in")

def test_cli_masks_finds_segmentation_class(tiny_voc, tmp_path, capsys):
    """A VOC-style set with SegmentationClass/ only: --source masks without --mask-dir used to look only in
    SegmentationClassAug/ and fail."""
    out = tmp_path / "labels.json"
    argv = [str(tiny_voc), "--source", "masks", "--classes", str(tiny_voc / "classes.txt"), "--out", str(out)]
    assert make_cls_labels.main(argv) == 0
    assert f"from {tiny_voc / 'SegmentationClass'}" in capsys.readouterr().out
    assert json.loads(out.read_text())["labels"]["b1"] == [1, 1]
    aug = tiny_voc / "SegmentationClassAug"  # when both exist, the augmented set is preferred
    aug.mkdir()
    shutil.copy(tiny_voc / "SegmentationClass" / "a1.png", aug / "a1.png")
    assert make_cls_labels.main(argv) == 0
    assert list(json.loads(out.read_text())["labels"]) == ["a1"]
    shutil.rmtree(aug)
    shutil.rmtree(tiny_voc / "SegmentationClass")
    assert make_cls_labels.main(argv) == 2
    err = capsys.readouterr().err
    assert "error: no mask PNG files in" in err and "SegmentationClassAug" in err and "--mask-dir" in err


def test_cli_reads_the_config(tiny_voc, tmp_path, capsys):
    config = tmp_path / "cfg.py"
    config.write_text(
        f"data = dict(root={str(tiny_voc)!r}, classes='classes.txt', mask_dir='SegmentationClass', "
        "label_file='made.json')\n"
    )
    assert make_cls_labels.main(["--config", str(config), "--source", "masks"]) == 0
    payload = json.loads((tiny_voc / "made.json").read_text())
    assert payload["classes"] == TINY_CLASSES and payload["labels"]["a2"] == [0, 1]
    assert make_cls_labels.main(["--config", str(config)]) == 0  # XML, same classes, same labels
    assert json.loads((tiny_voc / "made.json").read_text()) == payload
    config.write_text(f"data = dict(root={str(tiny_voc)!r}, layout='tags', label_file='tags.csv')\n")
    assert make_cls_labels.main(["--config", str(config)]) == 2
    assert "tags layout" in capsys.readouterr().err
