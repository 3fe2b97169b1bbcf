"""The HTML gallery of an inference run (``index.html``): input, predicted mask, ground truth (when the input
is a VOC split with masks), CAM, and a colour legend of the classes present."""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import quote

import numpy as np
from PIL import Image

from wsss.data.classes import voc_palette
from wsss.inference.sources import output_paths, writing
from wsss.inference.visualize import mask_overlay
from wsss.utils.fileio import atomic_write_text, read_image, read_mask, save_image

__all__ = ["find_ground_truth", "write_gallery"]


def _url(path: str) -> str:
    return html.escape(quote(path), quote=True)


def find_ground_truth(root: str | Path, mask_dirs: Sequence[str], rels: Sequence[str]) -> dict[str, Path]:
    """The ground-truth mask of each image of a VOC split that has one: ``root/<mask_dir>/<rel stem>.png`` in
    the first of ``mask_dirs`` that exists."""
    folder = next((Path(root) / d for d in mask_dirs if (Path(root) / d).is_dir()), None)
    if folder is None:
        return {}
    found = {rel: folder / Path(rel).with_suffix(".png") for rel in rels}
    return {rel: path for rel, path in found.items() if path.is_file()}


def _write_truth_overlay(output: Path, rel: str, mask_path: Path) -> str:
    """``gt/<rel>.jpg``: the ground truth over the thumbnail (nearest-neighbour resized); its relative URL."""
    thumb = read_image(output_paths(output, rel, ("thumbs",))["thumbs"])
    mask = Image.fromarray(read_mask(mask_path)).resize((thumb.shape[1], thumb.shape[0]), Image.NEAREST)
    target = output_paths(output, rel, ("gt",))["gt"]
    with writing(target):
        save_image(target, mask_overlay(thumb, np.asarray(mask)))
    return target.relative_to(output).as_posix()


def _legend(classes: Sequence[str], present: set[int]) -> str:
    palette = voc_palette()
    items = []
    for index in sorted(i for i in present if i < len(classes)):
        r, g, b = (int(v) for v in palette[index])
        swatch = f'<span style="display:inline-block;width:14px;height:14px;background:rgb({r},{g},{b})"></span>'
        items.append(f"<span style='margin-right:12px'>{swatch} {html.escape(classes[index])}</span>")
    return "<p>Classes present: " + "".join(items) + "</p>\n"


def write_gallery(
    output: str | Path,
    rels: Sequence[str],
    labels: dict[str, dict] | None = None,
    cls_thresh: float = 0.5,
    classes: Sequence[str] = (),
    truth: dict[str, Path] | None = None,
) -> Path:
    """Write ``output/index.html``: one row per image with its thumbnail, mask overlay, ground truth and CAM.

    Args:
        output: The inference output folder (``thumbs/``, ``overlays/``, ``cams/``, ``masks/`` of ``rels``).
        rels: The images, as relative paths of the input.
        labels: Per image, the classes shown in its CAM (``image_labels.json``'s entries).
        cls_thresh: The classifier threshold, for the caption.
        classes: Class names; with them a colour legend of the classes in the masks (predicted and true).
        truth: Ground-truth mask per image; a ground-truth column when any is given (overlaid on the thumbnail,
            written to ``gt/``).

    Links are relative (the folder can be moved or served as is); names are HTML-escaped and URLs
    percent-encoded.

    Raises:
        OutputError: A file could not be written (a full disk); the message names it.
    """
    output = Path(output)
    labels, truth = labels or {}, truth or {}
    present: set[int] = set()
    rows = []
    for rel in rels:
        paths = output_paths(Path(), rel, ("thumbs", "overlays", "cams", "masks"))
        urls = [_url(paths[kind].as_posix()) for kind in ("thumbs", "overlays")]
        if truth:
            urls.append(_url(_write_truth_overlay(output, rel, truth[rel])) if rel in truth else None)
        urls.append(_url(paths["cams"].as_posix()))
        cells = [
            f'<td><a href="{u}"><img src="{u}" height="160" loading="lazy" alt=""></a></td>' if u else "<td></td>"
            for u in urls
        ]
        if classes:
            present.update(np.unique(read_mask(output / paths["masks"])).tolist())
            if rel in truth:
                present.update(np.unique(read_mask(truth[rel])).tolist())
        info = labels.get(rel, {})
        shown = ", ".join(info.get("cam_classes", []))
        note = " (top-1)" if info.get("top1_fallback") else ""
        rows.append(
            f"<tr><td>{html.escape(rel)}</td>{''.join(cells)}<td>{html.escape(shown)}{html.escape(note)}</td></tr>"
        )
    header = "<th>image</th><th>input</th><th>mask</th>" + ("<th>ground truth</th>" if truth else "")
    page = (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>wsss predictions</title>\n'
        "<style>body{font-family:sans-serif} td{padding:4px;vertical-align:top}</style></head><body>\n"
        f"<p>{len(rels)} images. Columns: input, predicted mask, "
        + ("ground truth, " if truth else "")
        + f"CAM of the classes the classifier predicts present (sigmoid &gt; {cls_thresh}; top-1 when none).</p>\n"
        + (_legend(classes, present) if classes else "")
        + f"<table><tr>{header}<th>CAM</th><th>CAM classes</th></tr>\n"
        + "\n".join(rows)
        + "\n</table></body></html>\n"
    )
    path = output / "index.html"
    with writing(path):
        atomic_write_text(path, page)
    return path
