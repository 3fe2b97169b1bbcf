from __future__ import annotations

import zlib

import albumentations as A
import numpy as np
import pytest
import torch

from tests.conftest import TINY_CLASSES
from wsss.config import DataConfig
from wsss.data.transforms import PixelNormalize, TrainAugment, backbone_mean_std, denormalize, normalize
from wsss.data.voc import VOCClsDataset, VOCSegDataset, collate_list
from wsss.utils.fileio import read_image, read_mask, save_mask

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def cfg_for(root, **kw) -> DataConfig:
    base = dict(
        root=str(root), classes="classes.txt", train_split="train", val_split="val",
        mask_dir="SegmentationClass", crop_size=32,
    )  # fmt: skip
    base.update(kw)
    return DataConfig(**base)


def test_mean_std_come_from_timm():
    mean, std = backbone_mean_std("deit_small_patch16_224")
    assert mean == pytest.approx(MEAN) and std == pytest.approx(STD)
    assert backbone_mean_std("vit_small_patch16_224.augreg_in21k")[0] == pytest.approx((0.5, 0.5, 0.5))
    with pytest.raises(ValueError, match="no model named"):
        backbone_mean_std("not_a_model")


def test_seg_dataset_values(tiny_voc):
    ds = VOCSegDataset(cfg_for(tiny_voc), MEAN, STD)
    assert ds.classes == TINY_CLASSES and ds.ids == ["b1", "b2"]
    item = ds[0]
    raw = read_image(tiny_voc / "JPEGImages" / "b1.jpg")
    assert item["image"].shape == (3, 40, 64) and item["mask"].shape == (40, 64)
    assert (item["raw"] == raw).all()
    assert torch.allclose(denormalize(item["image"][None], MEAN, STD)[0], normalize(raw, (0,) * 3, (1,) * 3), atol=1e-6)
    assert item["mask"][10, 10] == 1 and item["mask"][3, 3] == 255 and item["mask"][0, 0] == 0
    batch = collate_list([ds[0], ds[1]])
    assert batch["id"] == ["b1", "b2"]


def test_cls_dataset_label_and_crop(tiny_voc):
    pad = (10.0, 20.0, 30.0)
    cfg = cfg_for(tiny_voc, scale_range=(0.5, 0.5), pad_rgb=pad, color_jitter_prob=0, grayscale_prob=0, blur_prob=0)
    ds = VOCClsDataset(cfg, MEAN, STD, with_mask=True)
    item = ds[2]  # b1: cat and dog, 64 x 40 scaled to 32 x 20: padded to 32 rows
    assert item["id"] == "b1" and item["label"].tolist() == [1.0, 1.0]
    assert item["image"].shape == (3, 32, 32) and item["mask"].shape == (32, 32)
    assert item["image"].dtype == torch.uint8  # the loader ships pixels; the device normalises them
    y0, y1, x0, x1 = item["box"].tolist()
    assert y1 - y0 == 20 and (x0, x1) == (0, 32)
    outside = torch.ones(32, 32, dtype=torch.bool)
    outside[y0:y1, x0:x1] = False
    assert (item["image"][:, outside] == torch.tensor(pad, dtype=torch.uint8)[:, None]).all()  # pad_rgb
    assert (item["mask"][outside] == 255).all()
    normalized = ds.normalize()(item["image"])
    expected = (torch.tensor(pad) / 255 - torch.tensor(MEAN)) / torch.tensor(STD)
    torch.testing.assert_close(normalized[:, outside], expected[:, None].expand(3, int(outside.sum())))


def test_the_device_normalises_the_loaders_pixels_as_albumentations_did(tiny_voc):
    """The loader ships uint8 crops and the step's device normalises them by table (PixelNormalize): bit for bit the
    float crops the augmentation made before, with albumentations' Normalize last in its pipeline, for every seed,
    every channel, every level."""
    cfg = cfg_for(tiny_voc)  # colour jitter, grayscale and blur at the reference's rates: crops of many levels
    ds = VOCClsDataset(cfg, MEAN, STD, seed=5)
    normalized = A.Compose([*ds.augment.transform.transforms, A.Normalize(mean=MEAN, std=STD, max_pixel_value=255.0)],
                           additional_targets={"valid": "mask"})  # fmt: skip
    items = [ds[i] for i in range(len(ds))]
    for index, item in enumerate(items):
        raw = read_image(tiny_voc / "JPEGImages" / f"{item['id']}.jpg")
        normalized.set_random_seed(zlib.crc32(f"5:0:{index}".encode()))  # the dataset's seed of this item
        size = raw.shape[:2]
        before = normalized(image=raw, mask=np.zeros(size, np.uint8), valid=np.ones(size, np.uint8))["image"]
        expected = torch.from_numpy(before.astype(np.float32)).permute(2, 0, 1)
        assert torch.equal(ds.normalize()(item["image"]), expected), item["id"]
        assert torch.equal(torch.from_numpy(ds.augment.table[np.arange(3), item["image"].permute(1, 2, 0).numpy()]),
                           expected.permute(1, 2, 0))  # TrainAugment.__call__'s host normalisation  # fmt: skip
    batch = torch.stack([item["image"] for item in items])
    assert torch.equal(ds.normalize()(batch), torch.stack([ds.normalize()(item["image"]) for item in items]))
    levels = torch.arange(256, dtype=torch.uint8).view(1, 1, 256).expand(3, 1, 256)
    by_arithmetic = (levels.double() / 255 - torch.tensor(MEAN, dtype=torch.float64).view(3, 1, 1)) / torch.tensor(
        STD, dtype=torch.float64).view(3, 1, 1)  # fmt: skip
    torch.testing.assert_close(PixelNormalize(MEAN, STD)(levels), by_arithmetic.float())  # each channel its own
    with pytest.raises(ValueError, match=r"uint8 pixels, got torch.float32 \(3, 4, 4\)"):
        PixelNormalize(MEAN, STD)(torch.zeros(3, 4, 4))


def test_cls_dataset_is_deterministic_per_epoch(tiny_voc):
    ds = VOCClsDataset(cfg_for(tiny_voc), MEAN, STD, seed=3)
    a, b = ds[0]["image"], ds[0]["image"]
    assert torch.equal(a, b)
    ds.epoch = 1
    assert not torch.equal(a, ds[0]["image"])


def test_augmentation_keeps_mask_aligned_with_image():
    """A colour-coded image: after scale, pad, crop and flip every valid pixel's colour still names its label."""
    h, w = 60, 90
    mask = np.zeros((h, w), np.uint8)
    mask[:, 30:60] = 1
    mask[:, 60:] = 2
    colours = np.array([[0, 0, 0], [255, 255, 255], [255, 0, 0]], np.uint8)
    image = colours[mask]
    cfg = DataConfig(crop_size=64, color_jitter_prob=0.0, grayscale_prob=0.0, blur_prob=0.0)
    aug = TrainAugment(cfg, (0.0, 0.0, 0.0), (1.0, 1.0, 1.0))
    flips = 0
    for seed in range(20):
        s = aug(image, mask, seed)
        y0, y1, x0, x1 = s.box
        inside = s.image[y0:y1, x0:x1] * 255.0
        m = s.mask[y0:y1, x0:x1]
        expected = colours[m].astype(np.float32)
        # away from label edges (bilinear blends neighbours there) colours match the labels exactly
        interior = np.ones_like(m, dtype=bool)
        for shift in (-2, -1, 1, 2):
            interior &= m == np.roll(m, shift, 1)
        assert np.abs(inside - expected)[interior].max() < 1.0
        assert (s.mask[:y0] == 255).all() and (s.mask[y1:] == 255).all()
        assert (s.mask[:, :x0] == 255).all() and (s.mask[:, x1:] == 255).all()
        assert (s.image[:y0] == 0).all() and (s.image[:, x1:] == 0).all()
        cols = [np.unique(m[:, j]) for j in range(m.shape[1])]
        order = [c[0] for c in cols if len(c) == 1]
        flips += order[0] > order[-1]  # label 2 (right) ended up on the left
    assert 0 < flips < 20


def test_padding_is_black_rgb_before_normalising():
    """The reference pads with RGB (0, 0, 0) and then normalises: padding reads -mean/std, not 0 (the mean grey)."""
    image = np.full((40, 30, 3), 200, np.uint8)
    cfg = DataConfig(crop_size=64, scale_range=(1.0, 1.0), color_jitter_prob=0, grayscale_prob=0, blur_prob=0)
    s = TrainAugment(cfg, MEAN, STD)(image, None, seed=0)
    y0, y1, x0, x1 = s.box
    assert (y1 - y0, x1 - x0) == (40, 30)
    outside = np.ones((64, 64), bool)
    outside[y0:y1, x0:x1] = False
    expected = -np.array(MEAN, np.float32) / np.array(STD, np.float32)
    np.testing.assert_allclose(s.image[outside], np.broadcast_to(expected, (outside.sum(), 3)), atol=1e-6)
    grey = DataConfig(**{**cfg.__dict__, "pad_rgb": (255.0 * MEAN[0], 255.0 * MEAN[1], 255.0 * MEAN[2])})
    s = TrainAugment(grey, MEAN, STD)(image, None, seed=0)
    assert np.abs(s.image[outside]).max() < 0.01


def test_blur_runs_on_the_padded_crop():
    """Colour augmentation comes after the crop: the blur mixes the image into the padding next to the box."""
    image = np.full((40, 30, 3), 255, np.uint8)
    cfg = DataConfig(crop_size=64, scale_range=(1.0, 1.0), color_jitter_prob=0, grayscale_prob=0,
                     blur_prob=1.0, blur_sigma=(2.0, 2.0))  # fmt: skip
    s = TrainAugment(cfg, (0.0,) * 3, (1.0,) * 3)(image, None, seed=1)
    y0, y1, x0, x1 = s.box
    sides = [s.image[y0 - 1, x0:x1] if y0 > 0 else None, s.image[y1, x0:x1] if y1 < 64 else None,
             s.image[y0:y1, x0 - 1] if x0 > 0 else None, s.image[y0:y1, x1] if x1 < 64 else None]  # fmt: skip
    sides = [side for side in sides if side is not None]
    assert sides and min(float(side.mean()) for side in sides) > 0.1  # blurred white reaches into the padding
    assert s.image[(y0 + y1) // 2, (x0 + x1) // 2].min() > 0.99  # the middle stays white


def test_scale_range_bounds_the_object_size():
    mask = np.zeros((100, 100), np.uint8)
    image = np.zeros((100, 100, 3), np.uint8)
    cfg = DataConfig(crop_size=256, scale_range=(0.5, 2.0), color_jitter_prob=0, grayscale_prob=0, blur_prob=0)
    aug = TrainAugment(cfg, (0.0,) * 3, (1.0,) * 3)
    sizes = [aug(image, mask, seed).box for seed in range(30)]
    heights = [b[1] - b[0] for b in sizes]
    assert min(heights) >= 50 and max(heights) <= 200 and max(heights) - min(heights) > 50


def test_missing_root(tmp_path):
    with pytest.raises(FileNotFoundError, match="dataset root not found.*data.root"):
        VOCSegDataset(cfg_for(tmp_path / "absent"), MEAN, STD)


def test_missing_split_file(tiny_voc):
    with pytest.raises(FileNotFoundError, match=r"split file not found.*nosuch.txt"):
        VOCSegDataset(cfg_for(tiny_voc, val_split="nosuch"), MEAN, STD)


def test_split_id_without_image(tiny_voc):
    (tiny_voc / "ImageSets" / "Segmentation" / "val.txt").write_text("b1\nghost\n")
    with pytest.raises(FileNotFoundError, match=r"val.txt have no image.*ghost"):
        VOCSegDataset(cfg_for(tiny_voc), MEAN, STD)


def test_split_id_without_label(tiny_voc):
    (tiny_voc / "ImageSets" / "Segmentation" / "train.txt").write_text("a1\nb2\n")
    (tiny_voc / "cls_labels.json").write_text('{"classes": ["background", "cat", "dog"], "labels": {"a1": [1, 0]}}')
    with pytest.raises(ValueError, match="missing from cls_labels.json.*b2"):
        VOCClsDataset(cfg_for(tiny_voc), MEAN, STD)


def test_mask_size_mismatch_names_files(tiny_voc):
    save_mask(tiny_voc / "SegmentationClass" / "b2.png", np.zeros((10, 12), np.uint8))
    ds = VOCSegDataset(cfg_for(tiny_voc), MEAN, STD)
    with pytest.raises(ValueError, match=r"b2.png: mask is 12x10 but image .*b2.jpg is 36x36"):
        ds[1]


def test_mask_values_out_of_range_name_file(tiny_voc):
    mask = read_mask(tiny_voc / "SegmentationClass" / "b2.png")
    mask[0, 0] = 5
    save_mask(tiny_voc / "SegmentationClass" / "b2.png", mask)
    ds = VOCSegDataset(cfg_for(tiny_voc), MEAN, STD)
    with pytest.raises(ValueError, match=r"b2.png: label values \[5\] are outside \[0, 3\)"):
        ds[1]


def test_classes_list_in_config_sets_class_count(tiny_voc):
    ds = VOCSegDataset(cfg_for(tiny_voc, classes=["background", "cat", "dog", "cow"]), MEAN, STD)
    assert len(ds.classes) == 4
    with pytest.raises(FileNotFoundError, match="class list file not found"):
        VOCSegDataset(cfg_for(tiny_voc, classes="nope.txt"), MEAN, STD)


def test_tiny_and_thin_images_train_with_at_least_one_pixel_per_side():
    """A 1x1 or 10000x1 training image scaled below 1 once asked OpenCV for 0 pixels (``cv2.error``); each side now
    keeps one pixel, and an ordinary image gets the pixels of albumentations' own RandomScale (the same draw)."""
    cfg = DataConfig(crop_size=16, scale_range=(0.5, 0.9), color_jitter_prob=0, grayscale_prob=0, blur_prob=0)
    aug = TrainAugment(cfg, (0.0,) * 3, (1.0,) * 3)
    for (h, w), seen in (((1, 1), (1, 1)), ((1, 10000), (1, 16)), ((3000, 1), (16, 1))):
        s = aug(np.full((h, w, 3), 255, np.uint8), np.ones((h, w), np.uint8), seed=0)
        y0, y1, x0, x1 = s.box
        assert (y1 - y0, x1 - x0) == seen and s.image.shape == (16, 16, 3)
        assert (s.image[y0:y1, x0:x1] == 1.0).all() and (s.mask[y0:y1, x0:x1] == 1).all()
        assert (s.mask == 255).sum() == 16 * 16 - seen[0] * seen[1]
    reference = A.Compose([A.RandomScale(scale_limit=(-0.5, -0.1), p=1.0)])
    ours = A.Compose([aug.transform.transforms[0]])
    image = np.random.default_rng(0).integers(0, 256, (37, 53, 3), dtype=np.uint8)
    for seed in range(5):
        reference.set_random_seed(seed)
        ours.set_random_seed(seed)
        assert np.array_equal(reference(image=image)["image"], ours(image=image)["image"])
