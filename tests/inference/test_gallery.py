"""The HTML gallery of an inference run: escaping, the plain mask column in the legend's colours, one captioned CAM
thumbnail per present class, the ground-truth column, a layout that fits 1400 px, and the files a run leaves."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest
import torch
from PIL import Image

from tests.inference.test_runner import trained  # noqa: F401  (the module-scoped fixture)
from tools import infer as infer_cli
from wsss.data.classes import voc_palette
from wsss.data.toy.render import TOY_CLASSES
from wsss.inference.folder.gallery import (
    class_cam_paths,
    find_ground_truth,
    present_indices,
    write_class_cams,
    write_gallery,
)
from wsss.inference.folder.layout import OutputLayout
from wsss.inference.folder.loop import THUMB_SIZE
from wsss.inference.folder.visualize import cam_thumbnails, thumbnail
from wsss.inference.predictor import Segmenter
from wsss.utils.fileio import read_image, read_mask, save_image, save_mask

CLASSES = ["background", "c1", "c2", "c3"]


def fake_run(out, rels, masks, present, scores=None, thumb_scale=2):
    """An output folder as ``run_inference --gallery`` leaves it: masks (palette PNG), thumbnails and full-size
    pictures (grey), one CAM thumbnail per present class (``class_cams/<stem>/<index>.jpg``) and the labels
    entries (returned) with the probabilities ``scores`` (default 0.9 for each present class)."""
    labels = {}
    for rel, mask in zip(rels, masks, strict=True):
        stem = rel.rsplit(".", 1)[0]
        h, w = mask.shape
        thumb = np.full((h // thumb_scale, w // thumb_scale, 3), 100, np.uint8)
        save_image(out / "thumbs" / f"{stem}.jpg", thumb)
        for kind in ("overlays", "cams"):
            save_image(out / kind / f"{stem}.jpg", np.full((h, w, 3), 100, np.uint8))
        for k in present[rel]:
            save_image(out / "class_cams" / stem / f"{k}.jpg", thumb)
        save_mask(out / "masks" / f"{stem}.png", mask, voc_palette())
        probs = (scores or {}).get(rel, {CLASSES[k]: 0.9 for k in present[rel]})
        labels[rel] = {"present": [CLASSES[k] for k in present[rel]], "top1_fallback": False, "scores": probs}
    return labels


def two_class_mask(h=20, w=40, left=1, right=2):
    mask = np.zeros((h, w), np.uint8)
    mask[:, : w // 2 - 2] = left
    mask[:, w // 2 + 2 :] = right
    return mask


def rows_of(page):
    """{image name: its row's HTML} (one line per image)."""
    rows = [line for line in page.splitlines() if line.startswith('<div class="row">')]
    return {re.search(r'<div class="name">(.*?)<', row).group(1): row for row in rows}


def test_gallery_escapes_names(tmp_path):
    rel = 'we"ird <b>&name #1.jpg'
    classes = ["background", "<cat>"]
    labels = fake_run(tmp_path, [rel], [two_class_mask(right=1)], {rel: [1]})
    labels[rel] = {"present": ["<cat>"], "top1_fallback": True, "scores": {"<cat>": 0.3}}
    page = write_gallery(tmp_path, [rel], labels, classes=classes).read_text()
    assert "<b>" not in page and "<cat>" not in page
    assert "we&quot;ird &lt;b&gt;&amp;name #1.jpg" in page and "&lt;cat&gt; 0.30 (top-1)" in page
    assert 'src="thumbs/we%22ird%20%3Cb%3E%26name%20%231.jpg"' in page
    assert 'src="class_cams/we%22ird%20%3Cb%3E%26name%20%231/1.jpg"' in page  # files named by class index
    assert str(tmp_path) not in page  # relative links only


def test_mask_column_is_the_plain_mask_in_the_legend_colours(tmp_path):
    """The mask column is the mask itself (no photo blended in) at the thumbnail's size, in a lossless PNG whose
    colours are exactly the legend's: a red disc is the legend's red, not olive under a green photo."""
    mask = two_class_mask(20, 40, left=1, right=3)
    fake_run(tmp_path, ["a.jpg"], [mask], {"a.jpg": [1, 3]})
    save_image(tmp_path / "thumbs" / "a.jpg", np.full((10, 20, 3), (0, 200, 0), np.uint8))  # a green photo
    page = write_gallery(tmp_path, ["a.jpg"], {}, classes=CLASSES).read_text()

    assert 'src="mask_thumbs/a.png"' in page
    with Image.open(tmp_path / "mask_thumbs" / "a.png") as im:
        assert im.format == "PNG" and im.size == (20, 10)  # the thumbnail's size
        colours = np.asarray(im.convert("RGB"))
    palette = voc_palette()
    np.testing.assert_array_equal(colours[:, :8], np.broadcast_to(palette[1], (10, 8, 3)))
    np.testing.assert_array_equal(colours[:, 12:], np.broadcast_to(palette[3], (10, 8, 3)))
    assert {tuple(c) for c in colours.reshape(-1, 3)} <= {tuple(palette[k]) for k in (0, 1, 3)}
    legend = page[page.index("Classes present") : page.index('<div class="row')]
    for k in (0, 1, 3):
        r, g, b = palette[k]
        assert f"background:rgb({r},{g},{b})" in legend and f"</span> {CLASSES[k]}<" in legend
    assert "c2" not in legend


def test_one_captioned_cam_thumbnail_per_present_class(tmp_path):
    """Each present class gets its own CAM cell, captioned with its name and probability, in the labels' order;
    a top-1 fallback says so; an image without a labels entry shows no CAM cell."""
    rels = ["a.jpg", "b.jpg", "c.jpg"]
    labels = fake_run(tmp_path, rels, [two_class_mask()] * 3, {"a.jpg": [1, 3], "b.jpg": [2], "c.jpg": []})
    labels["a.jpg"]["scores"] = {"c1": 0.91, "c2": 0.1, "c3": 0.62}
    labels["b.jpg"].update(top1_fallback=True, scores={"c1": 0.2, "c2": 0.4, "c3": 0.1})
    del labels["c.jpg"]
    rows = rows_of(write_gallery(tmp_path, rels, labels, 0.5, CLASSES).read_text())

    cams = re.findall(r'<img src="(class_cams/[^"]*)".*?<figcaption>(.*?)</figcaption>', rows["a.jpg"])
    assert [src for src, _ in cams] == ["class_cams/a/1.jpg", "class_cams/a/3.jpg"]
    assert [re.sub("<[^>]*>", "", caption).strip() for _, caption in cams] == ["c1 0.91", "c3 0.62"]
    (caption,) = re.findall(r"<figcaption>(.*?)</figcaption>", rows["b.jpg"].split('class="cams"')[1])
    assert re.sub("<[^>]*>", "", caption).strip() == "c2 0.40 (top-1)"
    assert "class_cams" not in rows["c.jpg"]


def test_ground_truth_column_and_legend(tmp_path):
    """The ground truth is shown plain like the mask (its 255 in the ignore colour, named in the legend); an image
    without ground truth gets an empty cell; a folder run has no ground-truth column."""
    out, root = tmp_path / "out", tmp_path / "voc"
    pred_a, pred_b = np.zeros((20, 40), np.uint8), np.zeros((20, 40), np.uint8)
    pred_a[:, 30:] = 2
    gt_a = np.zeros((20, 40), np.uint8)
    gt_a[:10] = 3
    gt_a[16:, :8] = 255
    labels = fake_run(out, ["a.jpg", "sub/b.jpg"], [pred_a, pred_b], {"a.jpg": [2], "sub/b.jpg": [1]})
    save_mask(root / "SegmentationClass" / "a.png", gt_a)
    truth = find_ground_truth(root, ["SegmentationClassAug", "SegmentationClass"], ["a.jpg", "sub/b.jpg"])
    assert truth == {"a.jpg": root / "SegmentationClass" / "a.png"}

    page = write_gallery(out, ["a.jpg", "sub/b.jpg"], labels, 0.5, CLASSES, truth).read_text()
    legend = page[page.index("Classes present") : page.index('<div class="row')]
    assert [c for c in CLASSES if f"</span> {c}<" in legend] == ["background", "c2", "c3"]
    r, g, b = voc_palette()[255]
    assert f"background:rgb({r},{g},{b})" in legend and "ignore" in legend
    assert ">ground truth<" in page and 'src="gt/a.png"' in page
    rows = rows_of(page)
    assert "gt/" not in rows["sub/b.jpg"] and rows["sub/b.jpg"].count('<figure class="cell"></figure>') == 1
    with Image.open(out / "gt" / "a.png") as im:
        assert im.format == "PNG" and im.size == (20, 10)
        shown = np.asarray(im.convert("RGB"))
    palette = voc_palette()
    np.testing.assert_array_equal(shown[:4], np.broadcast_to(palette[3], (4, 20, 3)))
    np.testing.assert_array_equal(shown[9, :3], np.broadcast_to(palette[255], (3, 3)))

    plain = write_gallery(out, ["a.jpg"], labels, 0.5, CLASSES).read_text()
    assert "ground truth" not in plain and "ignore" not in plain


def test_layout_fits_1400_px(tmp_path):
    """Structurally (no browser needed): no image has a size of its own (CSS sizes them), the fixed columns
    plus one CAM cell fit in 1400 px less a scrollbar, and the CAM cells wrap. The rendered check is
    tests/inference/test_gallery_browser.py."""
    out, root = tmp_path / "out", tmp_path / "voc"
    wide = np.zeros((100, 256), np.uint8)
    labels = fake_run(out, ["a.jpg"], [wide], {"a.jpg": [1, 2, 3]}, thumb_scale=1)
    save_mask(root / "SegmentationClass" / "a.png", wide)
    page = write_gallery(out, ["a.jpg"], labels, 0.5, CLASSES, {"a.jpg": root / "SegmentationClass" / "a.png"})
    page = page.read_text()
    assert not re.search(r"<img[^>]*\b(width|height)=", page)
    css = dict(re.findall(r"--(\w+):(\d+)px", page))
    fixed = int(css["name"]) + 4 * (int(css["cell"]) + int(css["gap"]))  # name, input, mask, overlay, truth
    assert fixed + int(css["cell"]) + 2 * int(css["margin"]) + 17 <= 1400  # + one CAM cell + a scrollbar
    assert re.search(r"\.cams\{[^}]*flex-wrap:wrap", page) and re.search(r"\.cams\{[^}]*min-width:0", page)
    assert re.search(r"\.cell img\{[^}]*max-width:var\(--cell\)[^}]*max-height:var\(--cell\)", page)


def test_gallery_of_a_voc_split_shows_ground_truth(trained, tmp_path):  # noqa: F811
    root, ckpt = trained
    out = tmp_path / "out"
    assert infer_cli.main([str(ckpt), str(root), str(out), "--split", "val", "--gallery", "--no-progress"]) == 0
    page = (out / "index.html").read_text()
    assert ">ground truth<" in page and "Classes present" in page
    assert sorted(p.name for p in (out / "gt").iterdir()) == ["val_00000.png", "val_00001.png"]
    folder_out = tmp_path / "folder"
    assert infer_cli.main([str(ckpt), str(root / "JPEGImages"), str(folder_out), "--gallery", "--no-progress"]) == 0
    assert "ground truth" not in (folder_out / "index.html").read_text()
    assert json.loads((folder_out / "summary.json").read_text())["done"] > 2


def test_a_run_writes_every_gallery_file_and_a_rerun_keeps_them(trained, tmp_path):  # noqa: F811
    """--gallery writes one CAM thumbnail per present class (named by class index, the thumbnail's size) and the
    plain mask thumbnail; a re-run that skips the finished images lists them all, touching none of their
    files; an image whose gallery files were lost is left out with a note, and --overwrite brings it back. Every
    class passes the classifier here: the present classes, their CAMs and captions are those the mask shows."""
    root, ckpt = trained
    out = tmp_path / "out"
    every_class = ["--cfg-options", "infer.cls_thresh=0.0"]  # every sigmoid passes: every class may be in the mask
    args = [str(ckpt), str(root / "JPEGImages"), str(out), "--gallery", "--no-progress", "--workers", "0", *every_class]
    assert infer_cli.main(args) == 0
    labels = json.loads((out / "image_labels.json").read_text())["images"]
    palette = {tuple(c) for c in voc_palette()[: len(TOY_CLASSES)]}
    rows = rows_of((out / "index.html").read_text())
    assert set(rows) == set(labels) and len(labels) == 6
    segmenter = Segmenter.from_checkpoint(ckpt, device="cpu")
    several = 0
    for rel, entry in labels.items():
        stem = rel.rsplit(".", 1)[0]
        mask = read_mask(out / "masks" / f"{stem}.png")
        shown = [k for k in np.unique(mask).tolist() if k]
        assert entry["present"] == [TOY_CLASSES[k] for k in shown]
        with Image.open(out / "thumbs" / f"{stem}.jpg") as im:
            size = im.size
        files = sorted((out / "class_cams" / stem).iterdir(), key=lambda p: int(p.stem))
        assert [p.name for p in files] == [f"{k}.jpg" for k in shown]
        pictures = []
        for path in files:
            with Image.open(path) as im:
                assert im.size == size
                pictures.append(np.asarray(im, dtype=np.int16))
        if len(pictures) > 1:
            several += 1
            # each class its own CAM: each picture is nearest to its class's CAM over the thumbnail (JPEG's losses)
            raw = read_image(root / "JPEGImages" / rel)
            every = torch.ones(1, len(TOY_CLASSES) - 1, dtype=torch.bool)
            cams = segmenter.run_batch([raw], cams=True).host_cams(every)[0].cam[[k - 1 for k in shown]]
            want = np.stack(cam_thumbnails(thumbnail(raw, THUMB_SIZE), cams)).astype(np.int16)
            for k, picture in enumerate(pictures):
                errors = np.abs(want - picture).mean(axis=(1, 2, 3))
                assert errors.argmin() == k and errors[k] < 3, (rel, shown, errors)
        captions = [re.sub("<[^>]*>", "", c).strip() for c in re.findall(r"<figcaption>(.*?)</figcaption>", rows[rel])]
        assert captions == [f"{n} {entry['scores'][n]:.2f}" for n in entry["present"]]
        with Image.open(out / "mask_thumbs" / f"{stem}.png") as im:
            assert im.size == size
            thumb = np.asarray(im.convert("RGB"))
        assert {tuple(c) for c in thumb.reshape(-1, 3)} <= palette
        assert set(np.unique(read_mask(out / "mask_thumbs" / f"{stem}.png"))) <= set(np.unique(mask))
    assert several  # an image with CAMs of several classes, told apart

    stats = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file() and p.parent != out}
    assert infer_cli.main(args) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["existing"] == 6 and summary["done"] == 0 and not summary["notes"]
    assert rows_of((out / "index.html").read_text()).keys() == rows.keys()
    assert {p: p.stat().st_mtime_ns for p in stats} == stats

    lost = next(rel for rel in sorted(labels) if labels[rel]["present"])
    next((out / "class_cams" / lost.rsplit(".", 1)[0]).iterdir()).unlink()
    assert infer_cli.main(args) == 0
    assert lost not in rows_of((out / "index.html").read_text())
    (note,) = json.loads((out / "summary.json").read_text())["notes"]
    assert "1 finished image is left out of index.html" in note and "--overwrite" in note
    assert infer_cli.main([*args, "--overwrite"]) == 0
    assert rows_of((out / "index.html").read_text()).keys() == rows.keys()


def test_class_cam_files_never_collide_and_stale_ones_go(tmp_path):
    """A folder per image and files named by class index: images ``a`` and ``a/1`` keep apart, odd class names
    never reach a path; a re-write drops the CAMs of classes no longer present and keeps foreign files."""
    thumb = np.full((8, 12, 3), 100, np.uint8)
    cams = torch.rand(2, 16, 24)
    write_class_cams(tmp_path, "a.jpg", cam_thumbnails(thumb, cams), [1, 3])
    write_class_cams(tmp_path, "a/1.png", cam_thumbnails(thumb, cams[:1]), [2])
    folder = tmp_path / "class_cams" / "a"
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()) == [
        "1.jpg", "1/2.jpg", "3.jpg",
    ]  # fmt: skip
    assert class_cam_paths(tmp_path, "a.jpg", [3]) == {3: folder / "3.jpg"}
    (folder / "notes.jpg").write_bytes(b"someone's")
    write_class_cams(tmp_path, "a.jpg", cam_thumbnails(thumb, cams[1:]), [3])
    assert sorted(p.name for p in folder.iterdir()) == ["1", "3.jpg", "notes.jpg"]
    entry = {"present": ["x/../y", "c1"]}
    assert present_indices(entry, ["background", "c1", "x/../y"]) == [2, 1]


def test_gallery_folders_cannot_point_outside_the_output(trained, tmp_path):  # noqa: F811
    """A gallery folder (class_cams/, mask_thumbs/) that is a symlink out of OUTPUT: the images are skipped with
    the reason and nothing is written outside."""
    root, ckpt = trained
    out, outside = tmp_path / "out", tmp_path / "outside"
    outside.mkdir()
    for kind in ("class_cams", "mask_thumbs"):
        out.mkdir(exist_ok=True)
        (out / kind).symlink_to(outside, target_is_directory=True)
        args = [str(ckpt), str(root / "JPEGImages"), str(out), "--gallery", "--no-progress", "--workers", "0"]
        assert infer_cli.main(args) == 1
        skipped = json.loads((out / "summary.json").read_text())["skipped"]
        assert len(skipped) == 6 and all("resolves outside the output folder" in s["reason"] for s in skipped)
        assert not any(outside.iterdir())
        (out / kind).unlink()


def test_an_input_inside_a_gallery_folder_is_refused(tmp_path):
    """class_cams/ and mask_thumbs/ are output kinds: INPUT inside them would be overwritten, so it is refused."""
    for kind in ("class_cams", "mask_thumbs"):
        (tmp_path / kind / "photos").mkdir(parents=True)
        with pytest.raises(ValueError, match=f"lies in {kind}/ of the output folder"):
            OutputLayout(tmp_path).check_input(tmp_path / kind / "photos")


def test_mask_thumbnails_follow_a_mask_that_was_rewritten(trained, tmp_path):  # noqa: F811
    """--overwrite with settings that change the masks: each mask thumbnail is that of the new mask, byte for byte
    what a fresh run with the new settings writes, not the first run's."""
    root, ckpt = trained
    common = [str(root), "--split", "val", "--gallery", "--no-progress", "--workers", "0", "--scales", "1.0"]
    every_class, top1 = ["--cfg-options", "infer.cls_thresh=0.0"], ["--cfg-options", "infer.cls_thresh=1.0"]
    out, fresh = tmp_path / "out", tmp_path / "fresh"
    assert infer_cli.main([str(ckpt), common[0], str(out), *common[1:], *every_class]) == 0
    first = {p.name: p.read_bytes() for p in (out / "mask_thumbs").iterdir()}
    assert infer_cli.main([str(ckpt), common[0], str(out), *common[1:], *top1, "--overwrite"]) == 0
    assert infer_cli.main([str(ckpt), common[0], str(fresh), *common[1:], *top1]) == 0
    rewritten = {p.name: p.read_bytes() for p in (out / "mask_thumbs").iterdir()}
    assert rewritten == {p.name: p.read_bytes() for p in (fresh / "mask_thumbs").iterdir()}
    assert len(first) == 2 and all(first[name] != rewritten[name] for name in first)  # the masks did change
    for name in first:  # and each thumbnail shows its mask's classes
        assert set(np.unique(read_mask(out / "mask_thumbs" / name))) <= set(np.unique(read_mask(out / "masks" / name)))


def test_a_mask_thumbnail_follows_its_mask_whatever_the_file_times(tmp_path):
    """A mask replaced by one with an older time (a backup restored with its times, ``cp -p``) or the same time (a
    coarse-clock file system) still gets its own thumbnail; an unchanged mask's thumbnail is not rewritten."""
    fake_run(tmp_path, ["a.jpg"], [two_class_mask(left=1, right=2)], {"a.jpg": [1, 2]})
    write_gallery(tmp_path, ["a.jpg"], {}, classes=CLASSES)
    thumb, mask = tmp_path / "mask_thumbs" / "a.png", tmp_path / "masks" / "a.png"
    kept = thumb.stat()
    write_gallery(tmp_path, ["a.jpg"], {}, classes=CLASSES)
    assert (thumb.stat().st_ino, thumb.stat().st_mtime_ns) == (kept.st_ino, kept.st_mtime_ns)
    for when, classes in ((kept.st_mtime_ns - 10**9, (3, 1)), (kept.st_mtime_ns, (2, 3))):
        save_mask(mask, two_class_mask(left=classes[0], right=classes[1]), voc_palette())
        os.utime(mask, ns=(when, when))
        write_gallery(tmp_path, ["a.jpg"], {}, classes=CLASSES)
        shown = read_mask(thumb)
        assert (shown[:, 0].tolist(), shown[:, -1].tolist()) == ([classes[0]] * 10, [classes[1]] * 10)


@pytest.mark.parametrize("crf", [[], ["--crf"]], ids=["argmax", "crf"])
def test_no_caption_or_cam_for_a_class_the_mask_does_not_show(trained, tmp_path, monkeypatch, capsys, crf):  # noqa: F811
    """Issue 38, 5.7: a grayscale photo's top-1 class (score 0.27) was captioned in the gallery, with its CAM, while
    its mask was all background. Its labels entry now names no class present (the rule still recorded), the gallery
    row has no CAM cell, and the one-image summary says the mask does not show the class."""
    from tests.inference.test_predictor import class_two_as_top1
    from wsss.inference import predictor

    _, ckpt = trained
    monkeypatch.setattr(predictor, "tta_forward", class_two_as_top1(len(TOY_CLASSES), shown=False))
    image, out = tmp_path / "gray.png", tmp_path / "out"
    save_image(image, np.full((40, 60, 3), 128, np.uint8))
    args = [str(ckpt), str(image), str(out), "--gallery", "--max-size", "32", "--workers", "0", "--no-progress"]
    assert infer_cli.main([*args, *crf]) == 0  # the CAMs (of no class) resized from the model's 32 px to 60 px
    assert not read_mask(out / "masks" / "gray.png").any()
    entry = json.loads((out / "labels" / "gray.json").read_text())
    assert entry["present"] == [] and entry["top1_fallback"] is True and entry["scores"][TOY_CLASSES[2]] == 0.2689
    assert not list((out / "class_cams").rglob("*.jpg"))
    (row,) = [line for line in (out / "index.html").read_text().splitlines() if 'class="name">gray.png<' in line]
    assert not [n for n in TOY_CLASSES if f"</span> {n} " in row]
    printed = capsys.readouterr().out
    rule = "the most probable: no class scores above 0.5; the mask does not show it"
    assert f"gray.png: present no class ({rule}); next most probable: {TOY_CLASSES[2]} 0.27" in printed
