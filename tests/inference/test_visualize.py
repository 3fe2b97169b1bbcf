"""Pictures: titled panel strips (the validation pictures in TensorBoard)."""

from __future__ import annotations

import numpy as np

from wsss.inference.visualize import TITLE_HEIGHT, titled_panels


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
