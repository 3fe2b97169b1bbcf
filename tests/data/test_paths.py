"""Ids confined to their root (one resolver for training, check_dataset and inference), and the pixel budget."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.conftest import tiny_config, tiny_tagged_config
from tools import check_dataset as check_cli
from wsss.config import dump_config
from wsss.data.check import check_dataset
from wsss.data.paths import UnsafePathError, safe_relative
from wsss.data.transforms import backbone_mean_std
from wsss.data.voc import TaggedValDataset, VOCClsDataset, VOCSegDataset, image_file, mask_file
from wsss.inference.folder.sources import list_split
from wsss.utils.fileio import read_image

MEAN_STD = backbone_mean_std("vit_tiny_patch16_224")


def secret(tmp_path: Path) -> Path:
    """A readable image outside every dataset root."""
    path = tmp_path / "private" / "secret.jpg"
    path.parent.mkdir()
    Image.fromarray(np.full((40, 40, 3), 7, np.uint8)).save(path)
    return path


@pytest.mark.parametrize(
    "name, clean",
    [
        ("a/b.jpg", "a/b.jpg"),
        ("./a//b.jpg", "a/b.jpg"),
        ("garden\\img_003.jpg", "garden/img_003.jpg"),
        ("/etc/passwd", None),
        ("\\\\server\\share\\x.jpg", None),
        ("C:\\photos\\x.jpg", None),
        ("../secret/private.jpg", None),
        ("a/../../b.jpg", None),
        ("garden\\..\\..\\x.jpg", None),
        ("", None),
    ],
)
def test_safe_relative(name, clean):
    assert safe_relative(name) == clean


def test_tags_with_an_absolute_or_climbing_id_are_refused_with_file_and_line(tiny_tagged, tmp_path):
    outside = secret(tmp_path)
    tags = tiny_tagged / "tags.csv"
    lines = tags.read_text().splitlines()
    for bad in (str(outside), f"../{outside.parent.name}/{outside.name}"):
        tags.write_text("\n".join([*lines[:3], f"{bad},cat", *lines[3:]]) + "\n")
        for dataset in (VOCClsDataset, TaggedValDataset):
            with pytest.raises(UnsafePathError, match=rf"{tags}:4 '{bad}'.*relative to"):
                dataset(tiny_tagged_config(tiny_tagged).data, *MEAN_STD, split="train")
        problems = {p.path: p.reason for p in check_dataset(tiny_tagged_config(tiny_tagged).data, progress=False)}
        assert list(problems) == [f"{tags}:4"] and "climbs with '..'" in problems[f"{tags}:4"]


def test_a_split_id_climbing_out_is_refused_in_training_check_and_inference(tiny_voc, tmp_path):
    outside = secret(tmp_path)
    rel = os.path.relpath(outside.with_suffix(""), tiny_voc / "JPEGImages")  # ../../private/secret
    (tiny_voc / "ImageSets" / "Segmentation" / "train.txt").write_text(f"a1\n{rel}\nb1\n")
    cfg = tiny_config(tiny_voc)
    with pytest.raises(UnsafePathError, match=r"train.txt:2 '\.\./\.\./private/secret'"):
        VOCClsDataset(cfg.data, *MEAN_STD)
    assert [p.path for p in check_dataset(cfg.data, progress=False)] == [
        str(tiny_voc / "ImageSets" / "Segmentation" / "train.txt") + ":2"
    ]
    sources, skipped = list_split(tiny_voc, "train")
    assert [s.rel for s in sources] == ["a1.jpg", "b1.jpg"] and skipped[0].path == rel


def test_windows_separators_find_the_nested_image(tiny_tagged):
    tags = tiny_tagged / "tags.csv"
    tags.write_text(tags.read_text().replace("set1/pets/a1.jpg", "set1\\pets\\a1.jpg"))
    cfg = tiny_tagged_config(tiny_tagged).data
    ids = VOCClsDataset(cfg, *MEAN_STD, split="train").ids + TaggedValDataset(cfg, *MEAN_STD, split="val").ids
    assert "set1/pets/a1.jpg" in ids and not any("\\" in i for i in ids)
    assert check_dataset(cfg, progress=False) == []


def test_symlinks_out_of_the_root_need_follow_symlinks(tiny_voc, tmp_path):
    outside = secret(tmp_path)
    image = tiny_voc / "JPEGImages" / "a1.jpg"
    image.unlink()
    image.symlink_to(outside)
    cfg = tiny_config(tiny_voc)
    with pytest.raises(UnsafePathError, match=r"a1.jpg resolves outside .*data.follow_symlinks=True reads it"):
        VOCClsDataset(cfg.data, *MEAN_STD)
    assert [p.path for p in check_dataset(cfg.data, progress=False)] == ["a1"]
    cfg.data.follow_symlinks = True
    assert VOCClsDataset(cfg.data, *MEAN_STD).image_path("a1") == image
    image.unlink()
    image.write_bytes(outside.read_bytes())
    inside_link = tiny_voc / "JPEGImages" / "a2.jpg"  # a symlink within the root is always followed
    (tiny_voc / "elsewhere").mkdir()
    inside_link.rename(tiny_voc / "elsewhere" / "a2.jpg")
    inside_link.symlink_to(tiny_voc / "elsewhere" / "a2.jpg")
    assert VOCClsDataset(tiny_config(tiny_voc).data, *MEAN_STD).image_path("a2") == inside_link

    mask = tiny_voc / "SegmentationClass" / "b2.png"  # masks are confined the same way
    (tmp_path / "private" / "b2.png").write_bytes(mask.read_bytes())
    mask.unlink()
    mask.symlink_to(tmp_path / "private" / "b2.png")
    with pytest.raises(UnsafePathError, match="b2.png resolves outside"):
        VOCSegDataset(tiny_config(tiny_voc).data, *MEAN_STD)


def test_follow_symlinks_follows_links_to_files_not_links_to_folders(tiny_voc, tmp_path):
    """data.follow_symlinks=True reads an image or mask that is itself a symlink leading out of the root; a file
    reached through a symlinked folder leading out (JPEGImages/ext -> elsewhere) stays refused, as documented."""
    outside = tmp_path / "outside"
    (outside / "images").mkdir(parents=True)
    (outside / "masks").mkdir()
    for image_id in ("a1", "a2"):
        (tiny_voc / "JPEGImages" / f"{image_id}.jpg").rename(outside / "images" / f"{image_id}.jpg")
        (tiny_voc / "SegmentationClass" / f"{image_id}.png").rename(outside / "masks" / f"{image_id}.png")
    (tiny_voc / "JPEGImages" / "a1.jpg").symlink_to(outside / "images" / "a1.jpg")  # links to files
    (tiny_voc / "SegmentationClass" / "a1.png").symlink_to(outside / "masks" / "a1.png")
    (tiny_voc / "JPEGImages" / "ext").symlink_to(outside / "images")  # links to folders
    (tiny_voc / "SegmentationClass" / "ext").symlink_to(outside / "masks")
    cfg = tiny_config(tiny_voc).data
    cfg.follow_symlinks = True
    assert image_file(tiny_voc, "a1", cfg) == tiny_voc / "JPEGImages" / "a1.jpg"
    assert mask_file(tiny_voc, "a1", cfg) == tiny_voc / "SegmentationClass" / "a1.png"
    with pytest.raises(UnsafePathError, match=r"ext/a2.jpg resolves outside .*outside/images/a2.jpg"):
        image_file(tiny_voc, "ext/a2", cfg)
    with pytest.raises(UnsafePathError, match=r"ext/a2.png resolves outside .*outside/masks/a2.png"):
        mask_file(tiny_voc, "ext/a2", cfg)
    (tiny_voc / "ImageSets" / "Segmentation" / "val.txt").write_text("a1\next/a2\n")
    with pytest.raises(UnsafePathError, match=r"ext/a2.jpg resolves outside"):
        VOCSegDataset(cfg, *MEAN_STD)


def test_check_dataset_reads_the_tags_layout(tiny_tagged, tmp_path, capsys):
    cfg = tiny_tagged_config(tiny_tagged)
    assert check_dataset(cfg.data, progress=False) == []
    (tiny_tagged / "set0" / "a2.jpg").write_text("not an image")
    Image.fromarray(np.zeros((300, 200, 3), np.uint8)).save(tiny_tagged / "set1" / "pets" / "b1.jpg")
    cfg.data.max_image_pixels = 200 * 299
    problems = {p.path: p.reason for p in check_dataset(cfg.data, progress=False)}
    assert set(problems) == {str(tiny_tagged / "set0" / "a2.jpg"), str(tiny_tagged / "set1" / "pets" / "b1.jpg")}
    assert "not a readable image" in problems[str(tiny_tagged / "set0" / "a2.jpg")]
    assert "200x300 is 60,000 pixels, over data.max_image_pixels = 59,800" in problems[
        str(tiny_tagged / "set1" / "pets" / "b1.jpg")
    ]
    dump_config(cfg, tmp_path / "cfg.py")
    assert check_cli.main([str(tmp_path / "cfg.py"), "--no-progress"]) == 1
    assert "2 problem(s)" in capsys.readouterr().out


def test_the_pixel_budget_is_read_from_the_header_and_0_means_no_cap(tmp_path):
    path = tmp_path / "big.png"
    Image.fromarray(np.zeros((30, 20, 3), np.uint8)).save(path)
    assert read_image(path, 600).shape == (30, 20, 3)  # at the budget
    with pytest.raises(ValueError, match=r"20x30 is 600 pixels, over data.max_image_pixels = 599"):
        read_image(path, 599)
    assert read_image(path, 0).shape == (30, 20, 3)


def test_training_skips_an_image_over_the_pixel_budget(tiny_voc, capsys):
    cfg = tiny_config(tiny_voc)
    cfg.data.max_image_pixels = 40 * 56 - 1  # train: a1 48 x 32 within, a2 40 x 56 and b1 64 x 40 over
    ds = VOCClsDataset(cfg.data, *MEAN_STD)
    assert ds[1]["id"] == ds[2]["id"] == "a1"  # a2 and b1 passed over: the next readable image in their place
    assert "over data.max_image_pixels" in capsys.readouterr().err
