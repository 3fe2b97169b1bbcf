from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image

from tools.make_toy_voc import main
from wsss.data.classes import load_classes, voc_palette
from wsss.data.labels import labels_from_masks, labels_from_xml
from wsss.data.toy.dataset import META_FILE, annotation_xml, make_toy_voc, save_contact_sheet, toy_voc_is_complete
from wsss.data.toy.render import (
    CLASS_HUES,
    CLASS_TEXTURES,
    PATTERNED_TEXTURES,
    PLAIN_TEXTURES,
    TEXTURES,
    TOY_CLASSES,
    TOY_VERSIONS,
    _any_colour,
    _distractor_texture,
    _ignore_band,
    _shared_colours,
    _texture,
    generate_sample,
)
from wsss.utils.fileio import read_image, read_mask

NUM_TRAIN, NUM_VAL = 8, 4
SUBDIRS = (("JPEGImages", ".jpg"), ("SegmentationClass", ".png"), ("Annotations", ".xml"))


@pytest.fixture(scope="module")
def toy_root(tmp_path_factory) -> Path:
    return make_toy_voc(tmp_path_factory.mktemp("toy") / "voc", num_train=NUM_TRAIN, num_val=NUM_VAL, seed=0)


def _ids(root: Path, split: str) -> list[str]:
    return (root / "ImageSets" / "Segmentation" / f"{split}.txt").read_text().split()


def _all_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _objects(root: Path, image_id: str) -> tuple[ET.Element, list[dict]]:
    tree = ET.parse(root / "Annotations" / f"{image_id}.xml").getroot()
    objs = []
    for o in tree.findall("object"):
        box = o.find("bndbox")
        objs.append({
            "name": o.findtext("name"),
            "difficult": int(o.findtext("difficult")),
            "bbox": tuple(int(box.findtext(k)) for k in ("xmin", "ymin", "xmax", "ymax")),
        })  # fmt: skip
    return tree, objs


def test_layout(toy_root):
    train, val = _ids(toy_root, "train"), _ids(toy_root, "val")
    assert len(train) == NUM_TRAIN and len(val) == NUM_VAL
    assert not set(train) & set(val)
    assert _ids(toy_root, "trainval") == train + val
    for image_id in train + val:
        for sub, ext in SUBDIRS:
            assert (toy_root / sub / f"{image_id}{ext}").is_file(), (sub, image_id)
    assert load_classes(toy_root / "classes.txt") == list(TOY_CLASSES)
    assert TOY_CLASSES[0] == "background" and 5 <= len(TOY_CLASSES) - 1 <= 6
    assert toy_voc_is_complete(toy_root, NUM_TRAIN, NUM_VAL, 0)
    assert not toy_voc_is_complete(toy_root, NUM_TRAIN, NUM_VAL, 1)
    assert not list(toy_root.rglob("*.tmp")), "temporary files left behind"


def test_determinism(toy_root, tmp_path):
    again = make_toy_voc(tmp_path / "again", num_train=NUM_TRAIN, num_val=NUM_VAL, seed=0)
    assert _all_bytes(again) == _all_bytes(toy_root)
    other = make_toy_voc(tmp_path / "other", num_train=NUM_TRAIN, num_val=NUM_VAL, seed=1)
    for image_id in _ids(toy_root, "trainval"):
        for sub, ext in SUBDIRS[:2]:
            assert (other / sub / f"{image_id}{ext}").read_bytes() != (toy_root / sub / f"{image_id}{ext}").read_bytes()


def test_more_images_keep_existing_ones(toy_root, tmp_path):
    bigger = make_toy_voc(tmp_path / "bigger", num_train=NUM_TRAIN + 2, num_val=NUM_VAL + 1, seed=0)
    for image_id in _ids(toy_root, "trainval"):
        name = f"JPEGImages/{image_id}.jpg"
        assert (bigger / name).read_bytes() == (toy_root / name).read_bytes()


def test_images_and_masks(toy_root):
    sizes = set()
    palette = voc_palette().reshape(-1).tolist()
    for image_id in _ids(toy_root, "trainval"):
        image = read_image(toy_root / "JPEGImages" / f"{image_id}.jpg")
        with Image.open(toy_root / "SegmentationClass" / f"{image_id}.png") as im:
            assert im.mode == "P" and im.getpalette() == palette
        mask = read_mask(toy_root / "SegmentationClass" / f"{image_id}.png")
        h, w = mask.shape
        assert image.shape == (h, w, 3)
        assert 160 <= h <= 320 and 160 <= w <= 320 and h != w
        sizes.add((h, w))
        values = set(np.unique(mask).tolist())
        assert values <= set(range(len(TOY_CLASSES))) | {255}
        assert {0, 255} <= values and len(values - {0, 255}) >= 1
        assert 0.005 < (mask == 255).mean() < 0.25
        assert image.std() > 20, "image should be cluttered, not flat"
    assert len(sizes) >= NUM_TRAIN


def test_ignore_band_separates_every_boundary(toy_root):
    """Pixels of two different labels are never within 2 px: a 255 band at least 4 px wide lies between."""
    kernel = np.ones((5, 5), np.uint8)
    for image_id in _ids(toy_root, "trainval"):
        mask = read_mask(toy_root / "SegmentationClass" / f"{image_id}.png")
        for v in np.unique(mask):
            if v == 255:
                continue
            near = cv2.dilate((mask == v).astype(np.uint8), kernel).astype(bool)
            others = (mask != v) & (mask != 255)
            assert not (near & others).any(), (image_id, int(v))


def test_ignore_band_rule():
    """Hand-computed: pixels within 2 px (Chebyshev) of another instance are ignored, here columns 3-6."""
    instances = np.zeros((10, 10), np.int32)
    instances[:, 5:] = 1
    instances[0:2, 0:2] = 2  # a second instance in the corner: band around it too
    band = _ignore_band(instances)
    expected = np.zeros((10, 10), bool)
    expected[:, 3:7] = True
    expected[0:4, 0:4] = True
    np.testing.assert_array_equal(band, expected)


def test_band_hugs_the_boundaries(toy_root):
    """Ignore pixels lie next to labelled pixels: the band is a thin strip, not filled regions."""
    far = []
    for image_id in _ids(toy_root, "trainval"):
        band = (read_mask(toy_root / "SegmentationClass" / f"{image_id}.png") == 255).astype(np.uint8)
        dist = cv2.distanceTransform(band, cv2.DIST_L2, 5)  # distance of each band pixel to a labelled one
        assert dist.max() <= 8.0, image_id  # thin object parts may be all band, but nothing wide
        far.append(dist[band > 0] > 3.0)
    assert np.concatenate(far).mean() < 0.03  # a 4 px band: 1-2 px from either side


def test_labels_from_xml_equal_labels_from_masks(toy_root):
    from_xml = labels_from_xml(toy_root / "Annotations", list(TOY_CLASSES))
    from_masks = labels_from_masks(toy_root / "SegmentationClass", len(TOY_CLASSES))
    assert from_xml.keys() == from_masks.keys() == set(_ids(toy_root, "trainval"))
    for image_id, vec in from_xml.items():
        np.testing.assert_array_equal(vec, from_masks[image_id])


def test_xml_matches_mask(toy_root):
    for image_id in _ids(toy_root, "trainval"):
        mask = read_mask(toy_root / "SegmentationClass" / f"{image_id}.png")
        h, w = mask.shape
        tree, objs = _objects(toy_root, image_id)
        assert tree.findtext("filename") == f"{image_id}.jpg"
        size = tree.find("size")
        assert (int(size.findtext("width")), int(size.findtext("height")), int(size.findtext("depth"))) == (
            w,
            h,
            3,
        )
        assert 1 <= len(objs) <= 3
        present = {TOY_CLASSES[v] for v in np.unique(mask) if 0 < v < len(TOY_CLASSES)}
        assert {o["name"] for o in objs} == present, image_id
        for o in objs:
            assert o["difficult"] in (0, 1)
            x0, y0, x1, y1 = o["bbox"]
            assert 1 <= x0 < x1 <= w and 1 <= y0 < y1 <= h
        for name in present:
            ys, xs = np.nonzero(mask == TOY_CLASSES.index(name))
            inside = np.zeros(len(xs), bool)
            for o in objs:
                if o["name"] == name:
                    x0, y0, x1, y1 = o["bbox"]
                    inside |= (xs + 1 >= x0) & (xs + 1 <= x1) & (ys + 1 >= y0) & (ys + 1 <= y1)
            assert inside.all(), (image_id, name)


def test_samples_cover_the_design():
    """Over many draws: every class, 1-3 objects, occlusions, difficult objects, large enough objects."""
    names, counts, difficult, occluded, fractions = set(), set(), 0, 0, []
    for i in range(60):
        s = generate_sample(np.random.default_rng((123, 0, i)))
        h, w = s.mask.shape
        counts.add(len(s.objects))
        for o in s.objects:
            names.add(o.name)
            difficult += o.difficult
            occluded += o.occluded
            x0, y0, x1, y1 = o.bbox
            in_box = s.mask[y0 - 1 : y1, x0 - 1 : x1] == TOY_CLASSES.index(o.name)
            assert in_box.sum() >= 40, "every object keeps >= 40 labelled pixels (never hidden)"
            if not o.difficult:
                x0, y0, x1, y1 = o.bbox
                fractions.append(max(x1 - x0 + 1, y1 - y0 + 1) / min(h, w))
    assert names == set(TOY_CLASSES[1:])
    assert counts == {1, 2, 3}
    assert difficult >= 1 and occluded >= 3
    assert 0.15 < np.median(fractions) < 0.6


def test_class_fills():
    """Each class has its own fill; patterned fills alternate between the two colours, plain ones do not."""
    assert set(CLASS_TEXTURES) == set(TOY_CLASSES[1:])
    assert len(set(CLASS_TEXTURES.values())) == len(CLASS_TEXTURES)
    assert set(CLASS_TEXTURES.values()) <= set(TEXTURES)
    black, white = np.zeros(3, np.float32), np.full(3, 255.0, np.float32)
    for kind in TEXTURES:
        fill = _texture(np.random.default_rng(0), kind, (black, white), (10, 20, 74, 84), (42.0, 52.0), 0.4)
        assert fill.shape == (64, 64, 3)
        grey = fill.mean(axis=2)
        if kind in ("speckle", "stripes", "checker", "dots"):
            assert (grey < 40).mean() > 0.1 and (grey > 215).mean() > 0.1, kind
        else:
            assert np.abs(np.diff(grey, axis=1)).mean() < 10, kind


def test_vivid_class_hues_on_muted_clutter():
    """Object pixels carry their class's hue at high saturation; background pixels are muted."""
    fg_hue_error, fg_sat, bg_sat = [], [], []
    for i in range(12):
        s = generate_sample(np.random.default_rng((7, 0, i)))
        hsv = cv2.cvtColor(s.image, cv2.COLOR_RGB2HSV_FULL).astype(np.float64) / 255.0
        core = cv2.erode((s.mask != 255).astype(np.uint8), np.ones((5, 5), np.uint8)).astype(bool)
        for c in set(np.unique(s.mask)) - {0, 255}:
            px = hsv[core & (s.mask == c)]
            if len(px) < 20:  # a thin sliver: all band
                continue
            vivid = px[px[:, 1] > 0.5]  # hue of the saturated pixels only (JPEG greys some dark fill pixels)
            mean = np.angle(np.exp(2j * np.pi * vivid[:, 0]).mean()) / (2 * np.pi) % 1.0
            fg_hue_error.append(abs((mean - CLASS_HUES[TOY_CLASSES[c]] + 0.5) % 1.0 - 0.5))
            fg_sat.append(np.median(px[:, 1]))
        bg_sat.append(np.median(hsv[core & (s.mask == 0), 1]))
    assert max(fg_hue_error) < 0.04, fg_hue_error
    assert min(fg_sat) > 0.7 and max(bg_sat) < 0.45, (fg_sat, bg_sat)  # noise adds some saturation
    hues = sorted(CLASS_HUES.values())
    assert set(CLASS_HUES) == set(TOY_CLASSES[1:]) and min(np.diff(hues + [hues[0] + 1])) > 0.1


def test_annotation_xml_round_trip():
    s = generate_sample(np.random.default_rng(7))
    root = ET.fromstring(annotation_xml("x", s.mask.shape[1], s.mask.shape[0], s.objects))
    assert [o.findtext("name") for o in root.findall("object")] == [o.name for o in s.objects]
    assert [int(o.findtext("truncated")) for o in root.findall("object")] == [o.truncated for o in s.objects]


def test_idempotent_and_regenerates_partial(tmp_path):
    root = make_toy_voc(tmp_path / "voc", num_train=3, num_val=2, seed=0)
    jpg = root / "JPEGImages" / "train_00000.jpg"
    stamp = jpg.stat().st_mtime_ns
    make_toy_voc(root, num_train=3, num_val=2, seed=0)
    assert jpg.stat().st_mtime_ns == stamp, "a complete dataset must not be rewritten"

    good = jpg.read_bytes()
    jpg.write_bytes(b"garbage")
    (root / META_FILE).unlink()  # as if interrupted before the marker was written
    assert not toy_voc_is_complete(root, 3, 2, 0)
    make_toy_voc(root, num_train=3, num_val=2, seed=0)
    assert jpg.read_bytes() == good and (root / META_FILE).is_file()

    (root / "Annotations" / "val_00001.xml").unlink()
    assert not toy_voc_is_complete(root, 3, 2, 0)

    make_toy_voc(root, num_train=2, num_val=1, seed=0)
    assert not (root / "JPEGImages" / "train_00002.jpg").exists(), "stale images of old params removed"
    assert not (root / "SegmentationClass" / "val_00001.png").exists()
    assert _ids(root, "train") == ["train_00000", "train_00001"]


def test_rejects_empty_splits(tmp_path):
    with pytest.raises(ValueError, match="at least one"):
        make_toy_voc(tmp_path / "voc", num_train=0, num_val=1)


def test_contact_sheet(toy_root, tmp_path):
    path = tmp_path / "sheet.png"
    save_contact_sheet(toy_root, path, _ids(toy_root, "train")[:4])
    with Image.open(path) as im:
        assert im.mode == "P" and im.height > 2 * 150


def test_cli(tmp_path, capsys):
    out, sheet = tmp_path / "voc", tmp_path / "sheet.png"
    assert main([str(out), "--num-train", "3", "--num-val", "2", "--seed", "5", "--sheet", str(sheet)]) == 0
    captured = capsys.readouterr()
    first = captured.out.strip()
    assert first.count("\n") == 0 and "3 train + 2 val" in first and "generated" in first
    assert "toy VOC: 100%" in captured.err and "5/5" in captured.err  # the progress bar
    assert sheet.is_file() and toy_voc_is_complete(out, 3, 2, 5)
    assert main([str(out), "--num-train", "3", "--num-val", "2", "--seed", "5"]) == 0
    assert "already complete" in capsys.readouterr().out
    assert main([str(out), "--num-train", "0"]) == 2


def test_opens_in_the_voc_datasets(toy_root, tmp_path):
    """The generated set is read by the same dataset classes as real VOC (labels made from its XML)."""
    from wsss.config import DataConfig
    from wsss.data.labels import save_labels
    from wsss.data.voc import VOCClsDataset, VOCSegDataset

    classes = load_classes(toy_root / "classes.txt")
    label_file = tmp_path / "cls_labels.json"  # beside, not inside, the shared generated set
    save_labels(label_file, labels_from_xml(toy_root / "Annotations", classes), classes)
    cfg = DataConfig(
        root=str(toy_root), classes="classes.txt", train_split="train", val_split="val",
        mask_dir="SegmentationClass", label_file=str(label_file), crop_size=96,
    )  # fmt: skip
    mean, std = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)
    seg = VOCSegDataset(cfg, mean, std)
    item = seg[0]
    raw = read_image(toy_root / "JPEGImages" / f"{seg.ids[0]}.jpg")
    assert item["image"].shape == (3, *raw.shape[:2]) and item["mask"].shape == raw.shape[:2]
    assert (item["mask"].numpy() == read_mask(toy_root / "SegmentationClass" / f"{seg.ids[0]}.png")).all()
    cls = VOCClsDataset(cfg, mean, std, with_mask=True)
    item = cls[0]
    assert item["image"].shape == (3, 96, 96) and item["label"].sum() >= 1
    mask = read_mask(toy_root / "SegmentationClass" / f"{cls.ids[0]}.png")
    present = sorted(int(v) - 1 for v in np.unique(mask) if 0 < v < len(classes))
    assert np.flatnonzero(item["label"].numpy()).tolist() == present


# ---------------------------------------------------------------------------------------------------------
# Version 3: the class is shape and fill; colours come from one distribution shared by every class


@pytest.fixture(scope="module")
def toy_v3_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("toy_v3") / "voc"
    return make_toy_voc(root, num_train=NUM_TRAIN, num_val=NUM_VAL, seed=0, version=3)


@pytest.mark.parametrize(
    "check",
    [
        test_images_and_masks,
        test_ignore_band_separates_every_boundary,
        test_band_hugs_the_boundaries,
        test_labels_from_xml_equal_labels_from_masks,
        test_xml_matches_mask,
    ],
    ids=lambda check: check.__name__.removeprefix("test_"),
)
def test_version_3_passes_the_layout_checks(toy_v3_root, check):
    check(toy_v3_root)


def test_version_is_recorded_and_regenerates(toy_root, toy_v3_root, tmp_path):
    assert TOY_VERSIONS == (2, 3)
    assert json.loads((toy_v3_root / META_FILE).read_text())["version"] == 3
    assert json.loads((toy_root / META_FILE).read_text())["version"] == 2  # the default
    assert toy_voc_is_complete(toy_v3_root, NUM_TRAIN, NUM_VAL, 0, version=3)
    assert not toy_voc_is_complete(toy_v3_root, NUM_TRAIN, NUM_VAL, 0)
    for image_id in _ids(toy_root, "trainval"):
        name = f"JPEGImages/{image_id}.jpg"
        assert (toy_v3_root / name).read_bytes() != (toy_root / name).read_bytes()

    root = make_toy_voc(tmp_path / "voc", num_train=2, num_val=1, seed=0, version=3)
    v3 = _all_bytes(root)
    make_toy_voc(root, num_train=2, num_val=1, seed=0)  # a cached set of another version regenerates
    assert toy_voc_is_complete(root, 2, 1, 0) and _all_bytes(root) != v3
    make_toy_voc(root, num_train=2, num_val=1, seed=0, version=3)
    assert _all_bytes(root) == v3, "deterministic per version"
    with pytest.raises(ValueError, match="version 4"):
        make_toy_voc(tmp_path / "v4", num_train=2, num_val=1, version=4)
    assert not (tmp_path / "v4").exists()


def test_version_3_samples_cover_the_design():
    names, counts, difficult = set(), set(), 0
    for i in range(40):
        s = generate_sample(np.random.default_rng((123, 0, i)), version=3)
        counts.add(len(s.objects))
        names |= {o.name for o in s.objects}
        difficult += sum(o.difficult for o in s.objects)
    assert names == set(TOY_CLASSES[1:]) and counts == {1, 2, 3} and difficult >= 1


def test_version_3_distractors_borrow_class_fills():
    """Version 3: a quarter of the distractors wear a class's patterned fill; version 2's never do."""
    rng = np.random.default_rng(0)
    borrowed = np.mean([_distractor_texture(rng, 0.25) in PATTERNED_TEXTURES for _ in range(4000)])
    assert 0.22 < borrowed < 0.28
    assert {_distractor_texture(rng, 0.0) for _ in range(200)} == set(PLAIN_TEXTURES)


def test_version_3_colours_ignore_the_class():
    """Every class and the distractors (class 0) get the very same colours from the same random state."""
    beneath = np.asarray([120.0, 90.0, 60.0], np.float32)
    for seed in range(20):
        draws = [_shared_colours(np.random.default_rng(seed), c, beneath) for c in range(len(TOY_CLASSES))]
        for a, b in draws[1:]:
            np.testing.assert_array_equal(a, draws[0][0])
            np.testing.assert_array_equal(b, draws[0][1])


def test_version_3_fill_colours_differ_in_brightness():
    """The two colours of a fill differ from each other and from what lies beneath in luma (JPEG keeps
    brightness at full resolution), whatever the class."""
    luma = np.asarray([0.299, 0.587, 0.114])
    rng = np.random.default_rng(0)
    between, beneath = [], []
    for i in range(500):
        under = _any_colour(rng)
        a, b = _shared_colours(rng, i % len(TOY_CLASSES), under)
        between.append(abs(luma @ (a - b)))
        beneath.append(min(abs(luma @ (a - under)), abs(luma @ (b - under))))
    assert np.percentile(between, 5) > 40 and np.percentile(beneath, 5) > 40


def test_cli_version_3(tmp_path, capsys):
    out = tmp_path / "voc"
    assert main([str(out), "--num-train", "2", "--num-val", "1", "--version", "3"]) == 0
    assert "version 3" in capsys.readouterr().out
    assert toy_voc_is_complete(out, 2, 1, 0, version=3) and not toy_voc_is_complete(out, 2, 1, 0)
    with pytest.raises(SystemExit):
        main([str(out), "--version", "1"])


def _foreground_colours(version: int, num_images: int, per_object: int = 40) -> tuple[np.ndarray, ...]:
    """RGB of up to ``per_object`` labelled pixels of each class in each image: colours (N, 3), their
    classes (N,) and images (N,)."""
    colours, classes, images = [], [], []
    for i in range(num_images):
        s = generate_sample(np.random.default_rng((11, 0, i)), version)
        pick = np.random.default_rng(i)
        for c in set(np.unique(s.mask).tolist()) - {0, 255}:
            px = s.image[s.mask == c]
            px = px[pick.choice(len(px), min(per_object, len(px)), replace=False)]
            colours.append(px)
            classes += [c] * len(px)
            images += [i] * len(px)
    return np.concatenate(colours).astype(np.float32), np.asarray(classes), np.asarray(images)


def _balanced(rows: np.ndarray, classes: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Indices into ``rows``: as many of every class as of the rarest, so chance is 1 / number of classes."""
    n = min(np.sum(classes[rows] == c) for c in range(1, len(TOY_CLASSES)))
    return np.concatenate([rng.choice(rows[classes[rows] == c], n, replace=False) for c in range(1, len(TOY_CLASSES))])


def _colour_classifier_accuracy(version: int, num_images: int = 100, k: int = 15) -> float:
    """Accuracy of a k-NN on pixel RGB that predicts the foreground class, trained on the pixels of the
    first half of the images and tested on the second half (balanced classes)."""
    colours, classes, images = _foreground_colours(version, num_images)
    rng = np.random.default_rng(0)
    train = _balanced(np.flatnonzero(images < num_images // 2), classes, rng)
    test = _balanced(np.flatnonzero(images >= num_images // 2), classes, rng)
    dist = ((colours[test, None, :] - colours[None, train, :]) ** 2).sum(axis=-1)
    neighbours = classes[train][np.argpartition(dist, k, axis=1)[:, :k]]
    votes = (neighbours[..., None] == np.arange(len(TOY_CLASSES))).sum(axis=1)
    return float((votes.argmax(axis=1) == classes[test]).mean())


@pytest.mark.slow
def test_colour_alone_tells_the_class_in_version_2_not_in_version_3():
    """A pixel's colour gives its class away in version 2 (class hues) and is at chance in version 3."""
    chance = 1.0 / (len(TOY_CLASSES) - 1)
    assert _colour_classifier_accuracy(2) >= 0.9
    assert _colour_classifier_accuracy(3) <= chance + 0.08


def test_refuses_a_folder_holding_another_dataset(tmp_path, capsys):
    voc = tmp_path / "voc"
    (voc / "JPEGImages").mkdir(parents=True)
    (voc / "JPEGImages" / "2007_000032.jpg").write_bytes(b"a real image")
    (voc / "ImageSets" / "Segmentation").mkdir(parents=True)
    (voc / "ImageSets" / "Segmentation" / "train.txt").write_text("2007_000032\n")
    (voc / "classes.txt").write_text("background\naeroplane\n")
    before = {p: p.read_bytes() for p in voc.rglob("*") if p.is_file()}
    with pytest.raises(ValueError, match="JPEGImages/2007_000032.jpg.*--overwrite"):
        make_toy_voc(voc, num_train=2, num_val=1)
    assert main([str(voc), "--num-train", "2", "--num-val", "1"]) == 2
    assert "error:" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in voc.rglob("*") if p.is_file()} == before  # untouched
    assert main([str(voc), "--num-train", "2", "--num-val", "1", "--overwrite"]) == 0
    assert toy_voc_is_complete(voc, 2, 1, 0) and _ids(voc, "train") == ["train_00000", "train_00001"]
    # a toy set with a label file beside it is complete: kept, no refusal; other parameters need --overwrite
    (voc / "cls_labels.json").write_text("{}")
    assert main([str(voc), "--num-train", "2", "--num-val", "1"]) == 0
    assert main([str(voc), "--num-train", "3", "--num-val", "1"]) == 2
