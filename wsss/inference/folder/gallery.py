"""The HTML gallery of an inference run (``index.html``) and the thumbnails it shows.

One row per image: its name, the input thumbnail, the predicted mask in the legend's colours (not blended with the
photo), the mask over the input, the ground truth in the legend's colours (a VOC split with masks), and one CAM
thumbnail per present class captioned with its name and probability; above the rows a colour legend of the
classes in the masks. Columns have fixed widths (:data:`LAYOUT`), images are sized by CSS and the CAM cells wrap,
so the page fits a 1400 px window with any number of present classes.

Files, ``<stem>`` being the input's relative path without its extension::

    thumbs/<stem>.jpg           input thumbnail, longest side 256 (written by the run)
    class_cams/<stem>/<k>.jpg   CAM of the class of index k over the thumbnail, one per present class (written by
                                the run: :func:`write_class_cams`; a folder per image, files named by class index)
    mask_thumbs/<stem>.png      predicted mask at the thumbnail's size, nearest neighbour, palette PNG (lossless:
                                the legend's colours exactly); written here, rewritten only when the mask
                                changed (whatever the files' times)
    gt/<stem>.png               the ground truth likewise (a VOC split whose masks exist)
"""

from __future__ import annotations

import html
import os
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import quote

import numpy as np
from PIL import Image

from wsss.data.classes import voc_palette
from wsss.inference.folder.layout import OutputLayout
from wsss.inference.folder.sources import writing
from wsss.inference.folder.visualize import resize_labels
from wsss.utils.fileio import atomic_write_text, read_mask, save_image, save_mask

__all__ = [
    "LAYOUT", "class_cam_paths", "find_ground_truth", "present_indices", "write_class_cams", "write_gallery",
]  # fmt: skip

LAYOUT = {"name": 140, "cell": 160, "gap": 6, "margin": 8}
"""Pixels of the page: the name column, an image cell (its image scaled to fit), the gap between cells, the page
margin. Name, input, mask, overlay and ground truth plus one CAM cell take 140 + 4 * 166 + 160 + 2 * 8 = 980 px;
in a 1400 px window (less a scrollbar) three CAM cells fit a line, the others wrap."""

_IGNORE = 255


def _url(path: str) -> str:
    """``path`` percent-encoded byte for byte, so a file name that is not UTF-8 still links to its file."""
    return html.escape(quote(os.fsencode(path)), quote=True)


def _text(name: str) -> str:
    """``name`` HTML-escaped, bytes that are not UTF-8 shown as U+FFFD (the page is UTF-8)."""
    return html.escape(os.fsencode(name).decode("utf-8", "replace"))


def find_ground_truth(root: str | Path, mask_dirs: Sequence[str], rels: Sequence[str]) -> dict[str, Path]:
    """The ground-truth mask of each image of a VOC split that has one: ``root/<mask_dir>/<rel stem>.png`` in
    the first of ``mask_dirs`` that exists."""
    folder = next((Path(root) / d for d in mask_dirs if (Path(root) / d).is_dir()), None)
    if folder is None:
        return {}
    found = {rel: folder / Path(rel).with_suffix(".png") for rel in rels}
    return {rel: path for rel, path in found.items() if path.is_file()}


def present_indices(entry: dict, classes: Sequence[str]) -> list[int]:
    """Class indices (into ``classes``, background 0) of a labels entry's ``present`` names, in its order."""
    index = {name: k for k, name in enumerate(classes)}
    return [index[name] for name in entry.get("present", []) if name in index]


def class_cam_paths(output: Path, rel: str, indices: Sequence[int]) -> dict[int, Path]:
    """:meth:`~wsss.inference.folder.layout.OutputLayout.class_cam_paths` under ``output``."""
    return OutputLayout(output).class_cam_paths(rel, indices)


def write_class_cams(output: Path, rel: str, pictures: Sequence[np.ndarray], indices: Sequence[int]) -> None:
    """Write the CAM thumbnails of input ``rel`` (:func:`class_cam_paths`), and remove those of classes not in
    ``indices`` left by an earlier run.

    Args:
        output: The output folder.
        rel: The input's relative path.
        pictures: K uint8 pictures, each a CAM blended over the image's thumbnail
            (:func:`~wsss.inference.folder.visualize.cam_thumbnails`).
        indices: The K class indices.

    Raises:
        OutputError: A file could not be written or removed; the message names it.
    """
    paths = class_cam_paths(output, rel, indices)
    folder = OutputLayout(output).paths(rel, ["class_cams"])["class_cams"]
    if folder.is_dir():
        for old in folder.glob("*.jpg"):
            if old.stem.isdigit() and int(old.stem) not in paths and old.is_file():
                with writing(old):
                    old.unlink(missing_ok=True)
    for path, picture in zip(paths.values(), pictures, strict=True):
        with writing(path):
            save_image(path, picture)


def _plain_thumbnail(source: Path, target: Path, size: tuple[int, int]) -> np.ndarray:
    """Write ``target``: the label map ``source`` at ``size`` (h, w), nearest neighbour, as a palette PNG, unless
    it holds that already (whatever the files' times: a mask restored from a backup may be older than its
    thumbnail); return which of the values 0..255 ``source`` holds."""
    labels = read_mask(source)
    small = resize_labels(labels, size)
    if not (target.is_file() and _same_labels(target, small)):
        with writing(target):
            save_mask(target, small, voc_palette())
    return np.bincount(labels.ravel(), minlength=256) > 0


def _same_labels(path: Path, labels: np.ndarray) -> bool:
    """Whether the label map ``path`` holds is ``labels`` (False for a file that is not one)."""
    try:
        return np.array_equal(read_mask(path), labels)
    except ValueError:
        return False


def _swatch(index: int) -> str:
    r, g, b = (int(v) for v in voc_palette()[index])
    return f'<span class="swatch" style="background:rgb({r},{g},{b})"></span>'


def _legend(classes: Sequence[str], seen: np.ndarray) -> str:
    shown = [(k, html.escape(classes[k])) for k in np.flatnonzero(seen[: len(classes)])]
    shown += [(_IGNORE, f"ignore ({_IGNORE})")] if seen[_IGNORE] else []
    items = "".join(f'<span class="item">{_swatch(k)} {name}</span>' for k, name in shown)
    return f'<p class="legend">Classes present: {items}</p>\n'


def _cell(src: str | None, href: str | None = None, plain: bool = False, caption: str = "") -> str:
    if src is None:
        return '<figure class="cell"></figure>'
    kind = ' class="labels"' if plain else ""
    caption = f"<figcaption>{caption}</figcaption>" if caption else ""
    return (
        f'<figure class="cell"><a href="{_url(href or src)}"><img src="{_url(src)}"{kind} loading="lazy" alt="">'
        f"</a>{caption}</figure>"
    )


def _cam_cells(rel: str, entry: dict, classes: Sequence[str]) -> str:
    scores = entry.get("scores", {})
    note = " (top-1)" if entry.get("top1_fallback") else ""
    cells = []
    for k, path in class_cam_paths(Path(), rel, present_indices(entry, classes)).items():
        score = f" {scores[classes[k]]:.2f}" if classes[k] in scores else ""
        cells.append(_cell(path.as_posix(), caption=f"{_swatch(k)} {html.escape(classes[k])}{score}{note}"))
    return "".join(cells)


_STYLE = (
    ":root{" + "".join(f"--{name}:{px}px;" for name, px in LAYOUT.items()) + "}\n"
    "body{font-family:sans-serif;margin:var(--margin)}\n"
    ".legend .item{display:inline-block;margin-right:12px;white-space:nowrap}\n"
    ".swatch{display:inline-block;width:14px;height:14px;vertical-align:middle;outline:1px solid #999}\n"
    ".row{display:flex;align-items:flex-start;gap:var(--gap);padding:6px 0;border-top:1px solid #ddd}\n"
    ".head,.head .name{font-weight:bold;font-size:14px}\n"
    ".name{flex:0 0 var(--name);overflow-wrap:anywhere;font-size:13px}\n"
    ".cell{flex:0 0 var(--cell);margin:0}\n"
    ".cell img{display:block;max-width:var(--cell);max-height:var(--cell)}\n"
    "img.labels{image-rendering:pixelated}\n"
    ".cams{flex:1 1 0;min-width:0;display:flex;flex-wrap:wrap;gap:var(--gap)}\n"
    "figcaption{font-size:12px;overflow-wrap:anywhere}\n"
)


def write_gallery(
    output: str | Path,
    rels: Sequence[str],
    labels: dict[str, dict] | None = None,
    cls_thresh: float = 0.5,
    classes: Sequence[str] = (),
    truth: dict[str, Path] | None = None,
) -> Path:
    """Write ``output/index.html`` (see the module docstring), and the mask and ground-truth thumbnails it shows.

    Args:
        output: The inference output folder: ``thumbs/``, ``overlays/``, ``cams/``, ``masks/`` and ``class_cams/``
            of ``rels``.
        rels: The images, as relative paths of the input.
        labels: Per image, its ``image_labels.json`` entry: the CAM cells show its ``present`` classes with
            their ``scores``; an image without one shows no CAM.
        cls_thresh: The classifier threshold, for the caption.
        classes: Class names, background first (their index names the CAM files and gives the colours).
        truth: Ground-truth mask per image; a ground-truth column when any is given.

    Links are relative (the folder can be moved or served as is); names are HTML-escaped and URLs
    percent-encoded.

    Raises:
        OutputError: A file could not be written (a full disk); the message names it.
        ValueError: A mask could not be read.
    """
    output = Path(output)
    labels, truth = labels or {}, truth or {}
    seen = np.zeros(256, bool)
    rows = []
    for rel in rels:
        paths = OutputLayout(Path()).paths(rel, ("thumbs", "overlays", "cams", "masks", "mask_thumbs", "gt"))
        with Image.open(output / paths["thumbs"]) as im:
            size = im.size[::-1]
        seen |= _plain_thumbnail(output / paths["masks"], output / paths["mask_thumbs"], size)
        cells = [
            _cell(paths["thumbs"].as_posix()),
            _cell(paths["mask_thumbs"].as_posix(), paths["masks"].as_posix(), plain=True),
            _cell(paths["overlays"].as_posix()),
        ]
        if truth:
            if rel in truth:
                seen |= _plain_thumbnail(truth[rel], output / paths["gt"], size)
            cells.append(_cell(paths["gt"].as_posix(), plain=True) if rel in truth else _cell(None))
        name = f'{_text(rel)}<br><a href="{_url(paths["cams"].as_posix())}">CAMs, full size</a>'
        cams = _cam_cells(rel, labels.get(rel, {}), classes)
        cells.append(f'<div class="cams">{cams}</div>')
        rows.append(f'<div class="row"><div class="name">{name}</div>{"".join(cells)}</div>')
    heads = ["input", "mask", "mask over input"] + (["ground truth"] if truth else [])
    head = "".join(f'<div class="cell">{h}</div>' for h in heads)
    page = (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>wsss predictions</title>\n'
        f"<style>\n{_STYLE}</style></head><body>\n"
        f"<p>{len(rels)} images. Columns: input; predicted mask in the legend's colours (click: full size); the mask "
        "over the input; "
        + ("ground truth; " if truth else "")
        + "the CAM of each class the classifier predicts present (sigmoid &gt; "
        f"{cls_thresh}; its top-1 class when none) and the mask shows, captioned with its probability.</p>\n"
        + _legend(classes, seen)
        + f'<div class="row head"><div class="name">image</div>{head}<div class="cams">CAM per present class</div>'
        "</div>\n" + "\n".join(rows) + "\n</body></html>\n"
    )
    path = output / "index.html"
    with writing(path):
        atomic_write_text(path, page)
    return path
