"""Image-level tags a user writes by hand: the only annotation a tag-only dataset (``data.layout="tags"``) has.

Two formats, chosen by the file's extension:

- CSV (``.csv``): a header row ``image,tags``, then one row per image; the tags are separated by ``;`` or
  spaces (quote the field when it holds a comma). An image with no tag shows background only.
- JSON (``.json``): ``{"image": ["tag", ...], ...}``.

Image paths are relative to the image folder (``data.root``/``data.image_dir``), with any nesting and with
their extension. The class list is ``background`` followed by the sorted tags unless ``data.classes`` gives it.
The split names ``train`` and ``val`` select a fixed partition of the file's images: an image is in ``val``
when a hash of its path falls below ``data.val_fraction``, so adding images never moves the others.
"""

from __future__ import annotations

import csv
import json
import re
import zlib
from pathlib import Path

import numpy as np

from wsss.data.labels import multi_hot

__all__ = ["hash_split", "read_tags", "tag_classes", "tag_labels"]

_SEPARATORS = re.compile(r"[;\s]+")


def read_tags(path: str | Path) -> dict[str, list[str]]:
    """``{image path: [tag, ...]}`` from a CSV or JSON tags file.

    Raises:
        FileNotFoundError: The file is missing.
        ValueError: The file is malformed (the message names the file, the line and the fix).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"tags file not found: {path}. Write one (CSV 'image,tags' or JSON {{image: [tags]}}) and set "
            "data.label_file to it."
        )
    if path.suffix.lower() == ".csv":
        tags = _read_csv(path)
    elif path.suffix.lower() == ".json":
        tags = _read_json(path)
    else:
        raise ValueError(f"{path}: a tags file must end in .csv or .json")
    if not tags:
        raise ValueError(f"{path}: lists no image")
    return tags


def _read_csv(path: Path) -> dict[str, list[str]]:
    with path.open(newline="", encoding="utf-8-sig") as f:
        rows = list(csv.reader(f))
    if not rows or [c.strip().lower() for c in rows[0]] != ["image", "tags"]:
        raise ValueError(f"{path}: the first line must be the header 'image,tags'")
    tags: dict[str, list[str]] = {}
    for line, row in enumerate(rows[1:], start=2):
        if not any(c.strip() for c in row):
            continue
        if len(row) != 2:
            raise ValueError(
                f"{path} line {line}: expected 2 fields (image,tags), got {len(row)}; separate tags with ';' or "
                "spaces, or quote the field"
            )
        _add(tags, row[0].strip(), [t for t in _SEPARATORS.split(row[1]) if t], f"{path} line {line}")
    return tags


def _read_json(path: Path) -> dict[str, list[str]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object {{image: [tags]}}")
    tags: dict[str, list[str]] = {}
    for image, names in data.items():
        if not isinstance(names, list) or not all(isinstance(t, str) and t.strip() for t in names):
            raise ValueError(f"{path}: the tags of '{image}' must be a list of non-empty strings, got {names!r}")
        _add(tags, image.strip(), [t.strip() for t in names], f"{path}")
    return tags


def _add(tags: dict[str, list[str]], image: str, names: list[str], where: str) -> None:
    if not image:
        raise ValueError(f"{where}: empty image path")
    if image in tags:
        raise ValueError(f"{where}: image '{image}' is listed twice; give all its tags in one entry")
    tags[image] = sorted(set(names))


def tag_classes(tags: dict[str, list[str]]) -> list[str]:
    """``background`` followed by every tag of the file, sorted."""
    names = sorted({t for ts in tags.values() for t in ts})
    if "background" in names:
        names.remove("background")
    return ["background", *names]


def tag_labels(tags: dict[str, list[str]], classes: list[str], path: str | Path) -> dict[str, np.ndarray]:
    """Multi-hot (C-1,) uint8 labels over the foreground classes; the tag ``background`` adds nothing.

    Raises:
        ValueError: A tag is not in ``classes`` (the message names the file, the image and the fix).
    """
    index = {name: i - 1 for i, name in enumerate(classes) if i > 0}
    labels = {}
    for image, names in tags.items():
        unknown = sorted(set(names) - set(index) - {"background"})
        if unknown:
            raise ValueError(
                f"{path}: image '{image}' has tag(s) {unknown} that are not in data.classes {classes[1:]}; "
                "add them there or leave data.classes unset to take the classes from the file"
            )
        labels[image] = multi_hot([index[n] for n in names if n in index], len(classes) - 1)
    return labels


def hash_split(images: list[str], val_fraction: float) -> tuple[list[str], list[str]]:
    """``(train, val)``: an image is in val when the CRC32 of its path, over 2^32, is below ``val_fraction``."""
    bound = val_fraction * 2**32
    val = [i for i in images if zlib.crc32(i.encode("utf-8")) < bound]
    chosen = set(val)
    return [i for i in images if i not in chosen], val
