"""The HTML gallery of an inference run: escaping, the colour legend, the ground-truth column."""

from __future__ import annotations

import json

import numpy as np

from tests.inference.test_runner import trained  # noqa: F401  (the module-scoped fixture)
from tools import infer as infer_cli
from wsss.data.classes import voc_palette
from wsss.inference.gallery import find_ground_truth, write_gallery
from wsss.utils.fileio import read_image, save_image, save_mask


def test_gallery_escapes_names(tmp_path):
    rel = 'we"ird <b>&name #1.jpg'
    path = write_gallery(tmp_path, [rel], {rel: {"cam_classes": ["<cat>"], "top1_fallback": True}})
    page = path.read_text()
    assert "<b>" not in page and "<cat>" not in page
    assert "we&quot;ird &lt;b&gt;&amp;name #1.jpg" in page and "&lt;cat&gt; (top-1)" in page
    assert 'src="thumbs/we%22ird%20%3Cb%3E%26name%20%231.jpg"' in page
    assert str(tmp_path) not in page  # relative links only


def fake_run(out, root, rels, masks, truths):
    """An inference output folder (thumbs 20x10, masks 40x20) and a VOC root with ground truth for some."""
    for rel, mask in zip(rels, masks, strict=True):
        stem = rel.rsplit(".", 1)[0]
        for kind in ("thumbs", "overlays", "cams"):
            save_image(out / kind / f"{stem}.jpg", np.full((10, 20, 3), 100, np.uint8))
        save_mask(out / "masks" / f"{stem}.png", mask)
    for rel, gt in truths.items():
        save_mask(root / "SegmentationClass" / f"{rel.rsplit('.', 1)[0]}.png", gt)


def test_legend_and_ground_truth_column(tmp_path):
    out, root = tmp_path / "out", tmp_path / "voc"
    classes = ["background", "c1", "c2", "c3"]
    pred_a, pred_b = np.zeros((20, 40), np.uint8), np.zeros((20, 40), np.uint8)
    pred_a[:, 30:] = 2
    gt_a = np.zeros((20, 40), np.uint8)
    gt_a[:10] = 3
    gt_a[0, 0] = 255
    fake_run(out, root, ["a.jpg", "sub/b.jpg"], [pred_a, pred_b], {"a.jpg": gt_a})
    truth = find_ground_truth(root, ["SegmentationClassAug", "SegmentationClass"], ["a.jpg", "sub/b.jpg"])
    assert truth == {"a.jpg": root / "SegmentationClass" / "a.png"}

    labels = {"a.jpg": {"cam_classes": ["c2"]}, "sub/b.jpg": {"cam_classes": ["c1"]}}
    page = write_gallery(out, ["a.jpg", "sub/b.jpg"], labels, 0.5, classes, truth).read_text()
    legend = page[page.index("Classes present"):page.index("<table>")]
    assert [c for c in classes if f"> {c}</span>" in legend] == ["background", "c2", "c3"]  # 255 is not a class
    r, g, b = voc_palette()[3]
    assert f"background:rgb({r},{g},{b})" in legend
    assert "<th>ground truth</th>" in page and 'src="gt/a.jpg"' in page
    row_b = page[page.index("<td>sub/b.jpg</td>"):]
    assert row_b.split("</tr>")[0].count("<td></td>") == 1  # b has no ground truth: an empty cell
    overlay = read_image(out / "gt" / "a.jpg")
    assert overlay.shape == (10, 20, 3)  # the thumbnail's size
    assert int(overlay[8, 5, 2]) - int(overlay[1, 5, 2]) > 30  # class 3 (olive, no blue) on the top half only

    plain = write_gallery(out, ["a.jpg"], {}, 0.5).read_text()
    assert "ground truth" not in plain and "Classes present" not in plain


def test_gallery_of_a_voc_split_shows_ground_truth(trained, tmp_path):  # noqa: F811
    root, ckpt = trained
    out = tmp_path / "out"
    assert infer_cli.main([str(ckpt), str(root), str(out), "--split", "val", "--gallery", "--no-progress"]) == 0
    page = (out / "index.html").read_text()
    assert "<th>ground truth</th>" in page and "Classes present" in page
    assert sorted(p.name for p in (out / "gt").iterdir()) == ["val_00000.jpg", "val_00001.jpg"]
    folder_out = tmp_path / "folder"
    assert infer_cli.main([str(ckpt), str(root / "JPEGImages"), str(folder_out), "--gallery", "--no-progress"]) == 0
    assert "ground truth" not in (folder_out / "index.html").read_text()
    assert json.loads((folder_out / "summary.json").read_text())["done"] > 2
