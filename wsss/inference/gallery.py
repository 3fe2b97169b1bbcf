"""The HTML gallery of an inference run (``index.html``)."""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import quote

from wsss.inference.sources import output_paths
from wsss.utils.fileio import atomic_write_text

__all__ = ["write_gallery"]


def _url(path: str) -> str:
    return html.escape(quote(path), quote=True)


def write_gallery(
    output: str | Path, rels: Sequence[str], labels: dict[str, dict] | None = None, cls_thresh: float = 0.5
) -> Path:
    """Write ``output/index.html``: one row per image with its thumbnail, mask overlay and CAM.

    Links are relative (the folder can be moved or served as is); names are HTML-escaped and URLs
    percent-encoded.
    """
    output = Path(output)
    labels = labels or {}
    rows = []
    for rel in rels:
        paths = output_paths(Path(), rel, ("thumbs", "overlays", "cams"))
        cells = []
        for kind in ("thumbs", "overlays", "cams"):
            url = _url(paths[kind].as_posix())
            cells.append(f'<td><a href="{url}"><img src="{url}" height="160" loading="lazy" alt=""></a></td>')
        info = labels.get(rel, {})
        shown = ", ".join(info.get("cam_classes", []))
        note = " (top-1)" if info.get("top1_fallback") else ""
        rows.append(
            f"<tr><td>{html.escape(rel)}</td>{''.join(cells)}<td>{html.escape(shown)}{html.escape(note)}</td></tr>"
        )
    page = (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>wsss predictions</title>\n'
        "<style>body{font-family:sans-serif} td{padding:4px;vertical-align:top}</style></head><body>\n"
        f"<p>{len(rels)} images. Columns: input, predicted mask, CAM of the classes the classifier predicts "
        f"present (sigmoid &gt; {cls_thresh}; top-1 when none).</p>\n"
        "<table><tr><th>image</th><th>input</th><th>mask</th><th>CAM</th><th>CAM classes</th></tr>\n"
        + "\n".join(rows)
        + "\n</table></body></html>\n"
    )
    path = output / "index.html"
    atomic_write_text(path, page)
    return path
