"""Inference inputs: split ids that would leave the image folder, symlinks that point outside it."""

from __future__ import annotations

import os

from wsss.inference.folder.sources import list_folder, list_split, safe_relative


def test_safe_relative():
    assert safe_relative("2007_000033") == "2007_000033"
    assert safe_relative("sub/./x") == "sub/x"
    for bad in ("../../etc/x", "/etc/passwd", "a/../../b", "", "..", "C:/x", "\\\\server\\x", "a\0b"):
        assert safe_relative(bad) is None, bad


def test_symlinks_outside_are_skipped_unless_followed(tmp_path):
    images = tmp_path / "JPEGImages"
    images.mkdir()
    for name in ("a.jpg", "b.png"):
        (images / name).write_bytes(b"x")
    (tmp_path / "secret_dir").mkdir()
    (tmp_path / "secret_dir" / "c.jpg").write_bytes(b"x")
    val = tmp_path / "val"
    val.mkdir()
    os.symlink(images / "a.jpg", val / "a.jpg")
    os.symlink(images / "b.png", val / "b.png")
    os.symlink(tmp_path / "secret_dir", val / "linked_dir")  # a folder link: never entered
    os.symlink(tmp_path / "gone.jpg", val / "dangling.jpg")

    sources, skipped = list_folder(val)
    assert sources == [] and {s.path for s in skipped} >= {"a.jpg", "b.png"}
    assert all("--follow-symlinks" in s.reason for s in skipped if s.path in ("a.jpg", "b.png"))
    sources, skipped = list_folder(val, follow_symlinks=True)
    assert [(s.rel, s.path) for s in sources] == [("a.jpg", val / "a.jpg"), ("b.png", val / "b.png")]
    assert "dangling.jpg" in {s.path for s in skipped}  # not a regular file behind the link

    # a VOC root whose JPEGImages are links into another copy
    voc = tmp_path / "voc"
    (voc / "ImageSets" / "Segmentation").mkdir(parents=True)
    (voc / "ImageSets" / "Segmentation" / "val.txt").write_text("a\nb\n")
    os.symlink(val, voc / "JPEGImages")
    assert list_split(voc, "val")[0] == []
    assert [s.rel for s in list_split(voc, "val", follow_symlinks=True)[0]] == ["a.jpg", "b.png"]
