"""Hand-written tags files: CSV and JSON parsing, the class list, the fixed train/val partition, datasets."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import tiny_tagged_config
from wsss.data.tags import hash_split, read_tags, tag_classes, tag_labels
from wsss.data.voc import TaggedValDataset, VOCClsDataset, val_dataset

MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)


def test_csv_separators_quotes_and_empty_rows(tmp_path):
    path = tmp_path / "tags.csv"
    path.write_text('image,tags\nx/a.jpg,cat;dog\n"b, c.png","dog  cat ; bird"\n\nd.jpg,\ne.jpg,cat cat\n')
    assert read_tags(path) == {
        "x/a.jpg": ["cat", "dog"], "b, c.png": ["bird", "cat", "dog"], "d.jpg": [], "e.jpg": ["cat"]
    }  # fmt: skip


def test_json_and_classes_from_the_file(tmp_path):
    path = tmp_path / "tags.json"
    path.write_text(json.dumps({"a.jpg": ["zebra", "ant"], "b/c.jpg": ["background", "ant"]}))
    tags = read_tags(path)
    classes = tag_classes(tags)
    assert classes == ["background", "ant", "zebra"]
    labels = tag_labels(tags, classes, path)
    assert labels["a.jpg"].tolist() == [1, 1] and labels["b/c.jpg"].tolist() == [1, 0]


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("t.csv", "img,labels\na.jpg,cat\n", "first line must be the header 'image,tags'"),
        ("t.csv", "image,tags\na.jpg,cat,dog\n", "line 2: expected 2 fields"),
        ("t.csv", "image,tags\na.jpg,cat\na.jpg,dog\n", "line 3: image 'a.jpg' is listed twice"),
        ("t.json", '{"a.jpg": "cat"}', "the tags of 'a.jpg' must be a list"),
        ("t.json", "[1]", "expected a JSON object"),
        ("t.txt", "a.jpg cat", "must end in .csv or .json"),
    ],
)
def test_malformed_files_name_the_file_and_the_fix(tmp_path, name, text, message):
    (tmp_path / name).write_text(text)
    with pytest.raises(ValueError, match=message) as err:
        read_tags(tmp_path / name)
    assert str(tmp_path / name) in str(err.value)


def test_unknown_tag_names_the_image(tmp_path):
    with pytest.raises(ValueError, match="image 'a.jpg' has tag\\(s\\) \\['cow'\\]"):
        tag_labels({"a.jpg": ["cow"]}, ["background", "cat"], tmp_path / "t.csv")


def test_hash_split_is_fixed_and_stable_under_additions():
    images = [f"img_{i}.jpg" for i in range(2000)]
    train, val = hash_split(images, 0.1)
    assert sorted(train + val) == sorted(images) and not set(train) & set(val)
    assert 150 < len(val) < 250
    train2, val2 = hash_split(images + [f"new_{i}.jpg" for i in range(500)], 0.1)
    assert set(val) <= set(val2) and set(train) <= set(train2)
    assert hash_split(images, 0.0)[1] == [] and hash_split(images, 1.0)[0] == []


def test_datasets_read_nested_images_without_masks(tiny_tagged):
    cfg = tiny_tagged_config(tiny_tagged).data
    train = VOCClsDataset(cfg, MEAN, STD)
    val = val_dataset(cfg, MEAN, STD)
    assert isinstance(val, TaggedValDataset)
    assert train.classes == ["background", "cat", "dog"]
    assert sorted(val.ids) == ["set0/b1.jpg", "set1/pets/b2.jpg", "set2/pets/a1.jpg", "set2/pets/a2.jpg"]
    assert len(train) == 8 and not set(train.ids) & set(val.ids)
    assert train.labels["set1/pets/b1.jpg"].tolist() == [1, 1]  # space-separated tags
    assert train[0]["image"].shape == (3, 32, 32)
    item = val[val.ids.index("set2/pets/a2.jpg")]
    assert item["label"].tolist() == [0.0, 1.0] and item["raw"].shape == (56, 40, 3)
    assert not list(tiny_tagged.rglob("*.png"))


def test_given_classes_are_kept_and_unknown_tags_rejected(tiny_tagged):
    cfg = tiny_tagged_config(tiny_tagged).data
    cfg.classes = ["background", "dog", "cat", "bird"]
    train = VOCClsDataset(cfg, MEAN, STD)
    assert train.labels["set0/a1.jpg"].tolist() == [0, 1, 0]
    cfg.classes = ["background", "cat"]
    with pytest.raises(ValueError, match="tag\\(s\\) \\['dog'\\] that are not in data.classes"):
        VOCClsDataset(cfg, MEAN, STD)


def test_empty_val_part_says_what_to_change(tiny_tagged):
    cfg = tiny_tagged_config(tiny_tagged).data
    cfg.val_fraction = 0.0
    with pytest.raises(ValueError, match="no image falls in the 'val' part.*data.val_fraction"):
        TaggedValDataset(cfg, MEAN, STD)
    assert np.isfinite(len(VOCClsDataset(cfg, MEAN, STD)))
