"""Hand-written tags files: CSV and JSON parsing, the class list, the fixed train/val partition, datasets."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import tiny_tagged_config
from tools import check_dataset as check_cli
from wsss.config import dump_config
from wsss.data.check import check_dataset
from wsss.data.tags import hash_split, read_tags, tag_classes, tag_labels, tag_warnings
from wsss.data.voc import TaggedValDataset, VOCClsDataset, val_dataset
from wsss.engine.train import train

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
        ("t.csv", "image,tags\na.jpg,cat\nb.jpg\n", "line 3: expected the image, a comma, then its tags"),
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


def test_commas_separate_tags_quoted_or_not(tmp_path):
    path = tmp_path / "tags.csv"
    path.write_text(
        'image,tags\na.jpg,"disc, ring"\nb.jpg,"disc,ring"\nc.jpg,disc,ring\nd.jpg,"Disc, "\ne.jpg,cat;dog,ring\n'
    )
    assert read_tags(path) == {
        "a.jpg": ["disc", "ring"], "b.jpg": ["disc", "ring"], "c.jpg": ["disc", "ring"], "d.jpg": ["Disc"],
        "e.jpg": ["cat", "dog", "ring"],
    }  # fmt: skip


def test_a_line_beyond_the_csv_field_limit_is_one_error_with_file_and_line(tmp_path):
    path = tmp_path / "tags.csv"
    path.write_text("image,tags\na.jpg,cat\nb.jpg," + "x" * 300_000 + "\nc.jpg,dog\n")
    with pytest.raises(ValueError, match=r"line 3: a field is longer than 131072 characters") as err:
        read_tags(path)
    assert str(err.value).startswith(f"{path} line 3:") and "\n" not in str(err.value)


def test_tag_warnings_name_near_duplicate_and_rare_classes(tmp_path):
    path = tmp_path / "tags.csv"
    tags = {f"{i}.jpg": ["disc", "ring"] for i in range(4)}
    tags |= {"a.jpg": ["Disc"], "b.jpg": ["disc.", "Ring"], "c.jpg": ["Background", "cat"], "d.jpg": ["background"]}
    assert tag_warnings(tags, tag_classes(tags), 0, path) == [
        f"warning: {path}: classes 'Background', 'background' differ only in case or surrounding punctuation; "
        "if they are one class, write it one way",
        f"warning: {path}: classes 'Disc', 'disc', 'disc.' differ only in case or surrounding punctuation; "
        "if they are one class, write it one way",
        f"warning: {path}: classes 'Ring', 'ring' differ only in case or surrounding punctuation; "
        "if they are one class, write it one way",
    ]
    rare = tag_warnings(tags, tag_classes(tags), 4, path)[3:]
    assert rare == [
        f"warning: {path}: 5 class(es) are tagged on fewer than data.min_class_images=4 images, too few to learn "
        "them: 'Background' (1), 'Disc' (1), 'Ring' (1), 'cat' (1), 'disc.' (1); tag more images of them or "
        "merge them into other classes"
    ]
    two_cats = {"a.jpg": ["cat"], "b.jpg": ["cat"]}
    assert tag_warnings(two_cats, ["background", "cat"], 2, path) == []
    assert tag_warnings(two_cats, ["background", "cat", "dog"], 2, path) == [
        f"warning: {path}: 1 class(es) are tagged on fewer than data.min_class_images=2 images, too few to learn "
        "them: 'dog' (0); tag more images of them or merge them into other classes"
    ]


def test_training_logs_the_tag_warnings(tiny_tagged, tmp_path, capsys):
    rows = (tiny_tagged / "tags.csv").read_text().replace("set0/b1.jpg,cat;dog", "set0/b1.jpg,Cat;dog")
    (tiny_tagged / "tags.csv").write_text(rows)
    cfg = tiny_tagged_config(tiny_tagged, max_iters=1, val_interval=1, ckpt_interval=1)
    cfg.data.min_class_images = 5
    train(cfg, work_dir=tmp_path / "w", device="cpu")
    log = (tmp_path / "w" / "log.txt").read_text()
    near = f"warning: {tiny_tagged / 'tags.csv'}: classes 'Cat', 'cat' differ only in case"
    rare = "1 class(es) are tagged on fewer than data.min_class_images=5 images, too few to learn them: 'Cat' (1)"
    assert near in log and rare in log
    assert near in capsys.readouterr().out


def test_two_entries_for_one_file_are_refused_naming_both_lines(tiny_tagged, tmp_path):
    """``img.jpg,disc`` then ``./img.jpg,ring`` once trained the image as ``ring`` alone, and check_dataset passed."""
    tags = tiny_tagged / "tags.csv"
    rows = tags.read_text().splitlines()
    assert rows[1] == "set0/a1.jpg,cat"
    cfg = tiny_tagged_config(tiny_tagged)
    for alias, first in (("./set0/a1.jpg", "set0/a1.jpg"), ("set0//a1.jpg", "set0/a1.jpg"), ("set0/a1", "set0/a1.jpg")):
        tags.write_text("\n".join([rows[0], f"{first},cat", *rows[2:4], f"{alias},dog", *rows[4:]]) + "\n")
        if alias == "set0/a1":  # the same file only once the image folder is known
            assert read_tags(tags)["set0/a1"] == ["dog"]
        else:
            with pytest.raises(ValueError, match=rf"line 5: image '{alias}' is listed twice \(first as '{first}' on "
                               "line 2"):  # fmt: skip
                read_tags(tags)
        with pytest.raises(ValueError, match=rf"^{tags} line 5: image '{alias}' is listed twice"):
            VOCClsDataset(cfg.data, MEAN, STD)
        assert [(p.path, p.reason.split(" (")[0]) for p in check_dataset(cfg.data, progress=False)] == [
            (f"{tags}:5", f"image '{alias}' is listed twice")
        ]
    tags.write_text("\n".join([rows[0], "set0/a1.jpg,cat", "set0/a2.jpg,cat", *rows[3:]]) + "\n")
    (tiny_tagged / "set0" / "a2.jpg").unlink()
    (tiny_tagged / "set0" / "a2.jpg").symlink_to("a1.jpg")  # a link and its target are one file
    with pytest.raises(ValueError, match=r"line 3: image 'set0/a2.jpg' is listed twice \(first as 'set0/a1.jpg'"):
        VOCClsDataset(cfg.data, MEAN, STD)
    path = tmp_path / "tags.json"
    path.write_text('{"a.jpg": ["disc"], "./a.jpg": ["ring"]}')
    with pytest.raises(ValueError, match=r"image './a.jpg' is listed twice \(first as 'a.jpg'; one file"):
        read_tags(path)
    path.write_text('{"a.jpg": ["disc"], "a.jpg": ["ring"]}')  # a repeated JSON key is not the last one winning
    with pytest.raises(ValueError, match=r"image 'a.jpg' is listed twice"):
        read_tags(path)


def test_a_tags_file_without_any_tag_is_a_problem(tiny_tagged, tmp_path, capsys):
    tags = tiny_tagged / "tags.csv"
    rows = tags.read_text().splitlines()
    tags.write_text("\n".join([rows[0], *(f"{row.split(',')[0]}," for row in rows[1:])]) + "\n")
    cfg = tiny_tagged_config(tiny_tagged)
    problems = check_dataset(cfg.data, progress=False)
    assert [p.path for p in problems] == [str(tags)]
    assert problems[0].reason.startswith("none of its 12 image(s) has a tag, so every image would be learnt as")
    dump_config(cfg, tmp_path / "cfg.py")
    assert check_cli.main([str(tmp_path / "cfg.py"), "--no-progress"]) == 1
    assert "no problems found" not in capsys.readouterr().out
    cfg.data.classes = ["background", "cat", "dog"]
    with pytest.raises(ValueError, match=rf"^{tags}: none of its 12 image\(s\) has a tag"):
        VOCClsDataset(cfg.data, MEAN, STD)
