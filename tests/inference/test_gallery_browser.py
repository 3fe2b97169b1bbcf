"""The gallery as a person sees it: rendered by headless Chromium at 1400 px (less a classic scrollbar), measured
in the page and checked on a screenshot. Skipped where no Chromium is installed (Debian:
``apt-get install chromium-headless-shell``)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import numpy as np
import pytest
from PIL import Image

from tests.inference.test_gallery import CLASSES, fake_run
from wsss.data.classes import voc_palette
from wsss.inference.folder.gallery import write_gallery
from wsss.utils.fileio import save_image, save_mask

BROWSERS = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome")
BROWSER = next((shutil.which(name) for name in BROWSERS if shutil.which(name)), None)
pytestmark = pytest.mark.skipif(BROWSER is None, reason="no Chromium (apt-get install chromium-headless-shell)")

VIEWPORT = (1400 - 17, 1600)
"""A 1400 px window less a classic vertical scrollbar (headless Chromium's scrollbars overlay the page)."""

PROBE = """<script>
const box = e => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
function measure() {
  const probe = {
    scrollWidth: document.documentElement.scrollWidth, clientWidth: document.documentElement.clientWidth,
    images: [...document.images].map(i => ({src: i.getAttribute("src"), box: box(i), loaded: i.naturalWidth})),
    rows: [...document.querySelectorAll(".row")].map(r => [...r.querySelectorAll(".cams figure")].map(box)),
    swatches: [...document.querySelectorAll(".swatch")].map(
      s => ({box: box(s), colour: getComputedStyle(s).backgroundColor})),
  };
  const pre = document.createElement("pre"); pre.id = "probe"; pre.textContent = JSON.stringify(probe);
  document.body.appendChild(pre);
}
const waited = Date.now();
(function poll() {  // lazy images load after the load event; measure once all have (or after 3 s)
  if ([...document.images].every(i => i.complete && i.naturalWidth) || Date.now() - waited > 3000) measure();
  else setTimeout(poll, 20);
})();
</script>"""


def chromium(*args: str) -> str:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", f"--window-size={VIEWPORT[0]},{VIEWPORT[1]}",
             "--force-device-scale-factor=1", "--force-color-profile=srgb", "--virtual-time-budget=5000"]  # fmt: skip
    return subprocess.run([BROWSER, *flags, *args], capture_output=True, text=True, timeout=120, check=True).stdout


def render(page):
    """(measurements of ``page`` laid out by Chromium, its screenshot (H, W, 3) uint8)."""
    probed = page.with_name("probe.html")
    probed.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    dom = chromium("--dump-dom", probed.as_uri())
    metrics = json.loads(re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S).group(1).replace("&quot;", '"'))
    shot = page.with_name("screenshot.png")
    chromium(f"--screenshot={shot}", page.as_uri())
    with Image.open(shot) as im:
        return metrics, np.asarray(im.convert("RGB"))


def test_rendered_gallery_fits_1400_px_and_shows_the_legend_colours(tmp_path):
    """A VOC-like run with ground truth, a wide and a tall image and six present classes: no horizontal
    scrollbar, every image loaded and at most 160 px, the six CAM cells wrap inside the window, and the mask
    column on screen has exactly the legend's colours (pixelated scaling, no blending with the photo)."""
    out, root = tmp_path / "out", tmp_path / "voc"
    classes = [*CLASSES, "c4", "c5", "c6"]
    wide, tall = np.zeros((100, 256), np.uint8), np.zeros((256, 64), np.uint8)
    wide[20:80, 10:120], wide[20:80, 140:250], tall[30:200, 8:56] = 1, 6, 3
    rels = ["wide.jpg", "tall.jpg"]
    scores = {"wide.jpg": {c: 0.8 for c in classes[1:]}, "tall.jpg": {"c3": 0.7}}
    labels = fake_run(out, rels, [wide, tall], {"wide.jpg": [1, 2, 3], "tall.jpg": [3]}, scores, thumb_scale=1)
    labels["wide.jpg"]["present"] = classes[1:]
    for k in range(4, 7):
        save_image(out / "class_cams" / "wide" / f"{k}.jpg", np.full((100, 256, 3), 100, np.uint8))
    save_image(out / "thumbs" / "wide.jpg", np.full((100, 256, 3), (0, 200, 0), np.uint8))  # a green photo
    save_mask(root / "SegmentationClass" / "wide.png", wide)
    truth = {"wide.jpg": root / "SegmentationClass" / "wide.png"}
    page = write_gallery(out, rels, labels, 0.5, classes, truth)

    metrics, shot = render(page)
    assert metrics["scrollWidth"] <= metrics["clientWidth"] == VIEWPORT[0], metrics["scrollWidth"]
    assert len(metrics["images"]) == 2 * 3 + 1 + 6 + 1  # input, mask, overlay; ground truth; CAMs
    for image in metrics["images"]:
        left, top, right, bottom = image["box"]
        assert image["loaded"] > 0 and 0 <= left and right <= VIEWPORT[0], image
        assert 0 < right - left <= 160 and 0 < bottom - top <= 160, image
    wide_cams = next(r for r in metrics["rows"] if len(r) == 6)
    assert len({round(top) for _, top, _, _ in wide_cams}) >= 2  # wrapped onto a second line
    assert all(right <= VIEWPORT[0] for _, _, right, _ in wide_cams)

    palette = voc_palette()
    on_screen = {}
    for swatch in metrics["swatches"]:
        left, top, right, bottom = (round(v) for v in swatch["box"])
        colour = shot[(top + bottom) // 2, (left + right) // 2]
        assert swatch["colour"] == f"rgb({colour[0]}, {colour[1]}, {colour[2]})"
        on_screen[tuple(colour)] = swatch
    (mask_box,) = [i["box"] for i in metrics["images"] if i["src"] == "mask_thumbs/wide.png"]
    left, top, right, bottom = (round(v) for v in mask_box)
    shown = {tuple(c) for c in shot[top + 1 : bottom - 1, left + 1 : right - 1].reshape(-1, 3)}
    assert shown == {tuple(palette[k]) for k in (0, 1, 6)}  # exactly the mask's classes, in the legend colours
    assert shown <= set(on_screen)
