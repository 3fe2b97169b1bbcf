"""Pictures: titled panel strips (the validation pictures in TensorBoard), the gallery's thumbnails, the legend of the
full-size CAM picture."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image, ImageDraw

from wsss.data.classes import voc_palette
from wsss.inference.folder.visualize import (
    TITLE_HEIGHT,
    cam_legend,
    cam_overlay,
    cam_peaks,
    cam_thumbnails,
    draw_cam_legend,
    heatmap,
    legend_font,
    resize_labels,
    thumbnail,
    titled_panels,
)


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


def test_the_full_size_cam_picture_names_its_classes_and_shows_the_colour_scale():
    """The legend of cams/<image>.jpg: a title, every class with its score (wrapped to the width), a colour bar
    from 0 to 1 in the heatmap's colours, each class named at its CAM's peak in its mask colour; drawn above the
    heatmap, which it leaves untouched outside the name boxes."""
    names, scores, indices = ["cat", "dog", "person"], [0.91, 0.62, 0.57], [8, 12, 15]
    peaks = [(10, 20), (60, 150), (95, 5)]
    legend = cam_legend(200, names, scores, peaks, indices)
    text = "CAM: the max over the present classes cat 0.91, dog 0.62, person 0.57"
    assert " ".join(legend.lines) == text
    draw = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    pad = max(2, legend.font_size // 3)
    assert all(draw.textlength(line, font=legend_font(legend.font_size)) <= 200 - 2 * pad for line in legend.lines)
    x0, y0, x1, y1 = legend.bar
    assert 0 < x0 < x1 < 200 and y1 <= legend.height
    assert [t for _, t in legend.ticks] == ["0", "1"] and legend.ticks[0][0] < x0 < x1 < legend.ticks[1][0] < 200
    palette = voc_palette()
    placed = zip(names, peaks, indices, strict=True)
    assert legend.peaks == [(name, x, y, tuple(palette[k].tolist())) for name, (y, x), k in placed]
    narrow = cam_legend(90, names, scores, peaks, indices)
    assert len(narrow.lines) > len(legend.lines) and narrow.height > legend.height  # wrapped, never cut
    assert " ".join(narrow.lines) == text and "person 0.57" in narrow.lines

    heat = np.full((legend.height + 100, 200, 3), 7, np.uint8)
    draw_cam_legend(heat, legend)
    bar = heat[(y0 + y1) // 2, x0:x1].astype(int)
    ends = heatmap(np.array([[0.0, 1.0]]))[0].astype(int)
    assert np.abs(bar[0] - ends[0]).max() <= 1 and np.abs(bar[-1] - ends[1]).max() <= 1
    for name, x, y, colour in legend.peaks:  # a box in the class colour around (x, y), clamped into the image
        box = heat[legend.height :][max(0, y - 2) : y + 3, max(0, x - 2) : x + 3]
        assert (box == colour).all(axis=-1).any(), name
    assert (heat[legend.height :, 60:120][40:] == 7).all()  # away from the boxes the heatmap is untouched
    empty = cam_legend(200, [], [], [], [])
    assert empty.lines[-1] == "no class" and empty.peaks == []


def test_each_class_is_named_at_its_cams_peak_in_image_pixels():
    """The peak of a (K, h, w) CAM at the model's resolution, as (y, x) in the image: its cell's centre, scaled."""
    cams = torch.zeros(3, 10, 20)
    cams[0, 3, 15] = 1.0
    cams[1, 9, 0] = 0.4
    cams[2] = 0.2
    assert cam_peaks(cams, (100, 400)) == [(35, 310), (95, 10), (5, 10)]
    assert cam_peaks(cams, (10, 20)) == [(3, 15), (9, 0), (0, 0)]  # the model's own size: the cell itself
    assert cam_peaks(cams[:0], (100, 400)) == []
