"""Pictures: titled panel strips (the validation pictures in TensorBoard), the gallery's thumbnails."""

from __future__ import annotations

import numpy as np
import torch

from wsss.inference.visualize import TITLE_HEIGHT, cam_overlay, cam_thumbnails, resize_labels, thumbnail, titled_panels


def test_titled_panels():
    rng = np.random.default_rng(0)
    panels = [rng.integers(0, 256, (30, w, 3), dtype=np.uint8) for w in (40, 25)]
    strip = titled_panels(panels, ["image", "CAM"])
    assert strip.shape == (30 + TITLE_HEIGHT, 65, 3)
    np.testing.assert_array_equal(strip[TITLE_HEIGHT:, :40], panels[0])
    np.testing.assert_array_equal(strip[TITLE_HEIGHT:, 40:], panels[1])
    bands = strip[:TITLE_HEIGHT, :40], strip[:TITLE_HEIGHT, 40:]
    assert all(band.max() > 200 and (band == 0).any() for band in bands)  # white text on black
    other = titled_panels(panels, ["ground truth", "CAM"])
    assert not np.array_equal(other[:TITLE_HEIGHT, :40], bands[0])
    np.testing.assert_array_equal(other[:TITLE_HEIGHT, 40:], bands[1])


def test_cam_thumbnails_one_per_class_at_the_thumbnail_size():
    """(K, h, w) CAMs at the model's resolution -> K heatmaps at the thumbnail's size over the thumbnail."""
    thumb = np.full((20, 30, 3), 100, np.uint8)
    cams = torch.zeros(2, 40, 60)
    cams[0, :, :30] = 1.0  # class 0 hot on the left, class 1 on the right
    cams[1, :, 30:] = 1.0
    pictures = cam_thumbnails(thumb, cams)
    assert len(pictures) == 2 and all(p.shape == (20, 30, 3) and p.dtype == np.uint8 for p in pictures)
    hot, cold = cam_overlay(thumb[:1, :1], np.ones((1, 1))), cam_overlay(thumb[:1, :1], np.zeros((1, 1)))
    np.testing.assert_array_equal(pictures[0][:, :13], np.broadcast_to(hot, (20, 13, 3)))
    np.testing.assert_array_equal(pictures[0][:, 17:], np.broadcast_to(cold, (20, 13, 3)))
    np.testing.assert_array_equal(pictures[1][:, ::-1], pictures[0])
    assert cam_thumbnails(thumb, torch.zeros(0, 40, 60)) == []


def test_thumbnail_and_nearest_label_resize():
    image = np.zeros((100, 400, 3), np.uint8)
    assert thumbnail(image, 256).shape == (64, 256, 3) and thumbnail(image[:50, :80], 256).shape == (50, 80, 3)
    labels = np.zeros((100, 400), np.uint8)
    labels[:, 200:] = 7
    small = resize_labels(labels, (64, 256))
    assert small.shape == (64, 256) and set(np.unique(small)) == {0, 7}  # no blended values
    assert (small[:, :127] == 0).all() and (small[:, 129:] == 7).all()
