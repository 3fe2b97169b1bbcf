"""Image-level tags a user writes by hand: the only annotation a tag-only dataset (``data.layout="tags"``) has.

Two formats, chosen by the file's extension:

- CSV (``.csv``): a header row ``image,tags``, then one row per image: its path, a comma, its tags separated
  by commas, ``;`` or spaces (``a.jpg,cat,dog``, ``a.jpg,"cat, dog"`` and ``a.jpg,cat dog`` are the same; quote
  an image path that holds a comma). An image with no tag (``a.jpg,``) shows background only.
- JSON (``.json``): ``{"image": ["tag", ...], ...}``.

Image paths are relative to the image folder (``data.root``/``data.image_dir``), with any nesting and with
their extension. One image has one entry: two entries that name one file (``a.jpg`` and ``./a.jpg``, or, given the
image folder, ``a`` and ``a.jpg``, a link and its target) are refused, naming both lines. The class list is
``background`` followed by the sorted tags unless ``data.classes`` gives it; a file without any tag is refused.
Tags are taken as written: ``Disc`` and ``disc`` are two classes (:func:`tag_warnings` names such pairs when
training starts).
The split names ``train`` and ``val`` select a fixed partition of the file's images: an image is in ``val``
when a hash of its path falls below ``data.val_fraction``, so adding images never moves the others.
"""

from __future__ import annotations

import csv
import json
import re
import string
import zlib
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np

from wsss.data.labels import multi_hot
from wsss.data.paths import safe_relative

__all__ = ["hash_split", "read_tags", "require_a_tag", "tag_classes", "tag_labels", "tag_warnings"]

_SEPARATORS = re.compile(r"[,;\s]+")


def read_tags(path: str | Path, find: Callable[[str], Path | None] | None = None) -> dict[str, list[str]]:
    """``{image path: [tag, ...]}`` from a CSV or JSON tags file; a plain relative path is cleaned
    (:func:`wsss.data.paths.safe_relative`: ``./a.jpg`` is ``a.jpg``), any other is kept as written.

    Args:
        path: The tags file.
        find: Maps a clean image path to its file (None if there is none); given, two entries whose files are one
            (same device and inode) are refused too.

    Raises:
        FileNotFoundError: The file is missing.
        ValueError: The file is malformed, or lists one image twice (the message names the file, the lines and
            the fix).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"tags file not found: {path}. Write one (CSV 'image,tags' or JSON {{image: [tags]}}) and set "
            "data.label_file to it."
        )
    if path.suffix.lower() == ".csv":
        entries = _read_csv(path)
    elif path.suffix.lower() == ".json":
        entries = _read_json(path)
    else:
        raise ValueError(f"{path}: a tags file must end in .csv or .json")
    if not entries:
        raise ValueError(f"{path}: lists no image")
    return _one_entry_per_image(path, entries, find)


_Entry = tuple[str, list[str], int | None]
"""One entry of a tags file: the image as written, its tags, and its line (None in JSON)."""


def _one_entry_per_image(
    path: Path, entries: list[_Entry], find: Callable[[str], Path | None] | None
) -> dict[str, list[str]]:
    """``{clean image path: sorted tags}``, refusing a second entry for one image (see :func:`read_tags`)."""
    tags: dict[str, list[str]] = {}
    seen: dict[object, tuple[str, int | None]] = {}  # clean path or (device, inode) -> (image as written, line)
    for image, names, line in entries:
        where = f"{path}" if line is None else f"{path} line {line}"
        if not image:
            raise ValueError(f"{where}: empty image path")
        clean = safe_relative(image)
        keys: list[object] = [clean or image]
        identity = _identity(find(clean)) if find is not None and clean is not None else None
        if identity is not None:
            keys.append(identity)
        for key in keys:
            if key in seen:
                first, first_line = seen[key]
                first_at = "" if first_line is None else f" on line {first_line}"
                raise ValueError(
                    f"{where}: image '{image}' is listed twice (first as '{first}'{first_at}; one file has one "
                    "entry): give all its tags in the first and remove this one"
                )
            seen[key] = (image, line)
        tags[clean or image] = sorted(set(names))
    return tags


def _identity(file: Path | None) -> tuple[int, int] | None:
    """(device, inode) of ``file`` (links followed), None if it is None or cannot be looked at."""
    try:
        stat = file.stat() if file is not None else None
    except OSError:
        return None
    return None if stat is None else (stat.st_dev, stat.st_ino)


class _Pairs(list):
    """A JSON object as its (key, value) pairs, a repeated key kept."""


def _read_csv(path: Path) -> list[_Entry]:
    entries: list[_Entry] = []
    line = 1  # where the row being read starts
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f)
            header = next(reader, [])
            if [c.strip().lower() for c in header] != ["image", "tags"]:
                raise ValueError(f"{path}: the first line must be the header 'image,tags'")
            line = reader.line_num + 1
            for row in reader:
                if any(c.strip() for c in row):
                    entries.append(_row_entry(row, f"{path} line {line}", line))
                line = reader.line_num + 1
    except csv.Error as err:
        raise ValueError(
            f"{path} line {line}: {_csv_problem(err)}; a tags file holds one short 'image,tags' line per image: "
            "check that data.label_file names it and that every quote is closed"
        ) from None
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text ({err.reason}); save it as UTF-8") from None
    return entries


def _csv_problem(err: csv.Error) -> str:
    """The csv module's error in words, with the limit of its ``field larger than field limit``."""
    if "field limit" in str(err):
        return f"a field is longer than {csv.field_size_limit()} characters"
    return f"not readable as CSV ({err})"


def _row_entry(row: list[str], where: str, line: int) -> _Entry:
    """One CSV row: the image, then tags in any of its other fields, split at commas, ``;`` and spaces."""
    if len(row) < 2:
        raise ValueError(f"{where}: expected the image, a comma, then its tags ('image,' for an image without tags)")
    return row[0].strip(), [t for field in row[1:] for t in _SEPARATORS.split(field) if t], line


def _read_json(path: Path) -> list[_Entry]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=_Pairs)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(data, _Pairs):
        raise ValueError(f"{path}: expected a JSON object {{image: [tags]}}")
    entries: list[_Entry] = []
    for image, names in data:
        if not isinstance(names, list) or not all(isinstance(t, str) and t.strip() for t in names):
            raise ValueError(f"{path}: the tags of '{image}' must be a list of non-empty strings, got {names!r}")
        entries.append((image.strip(), [t.strip() for t in names], None))
    return entries


def require_a_tag(tags: dict[str, list[str]], path: str | Path) -> None:
    """Raise ValueError naming ``path`` and the fix when no image of ``tags`` has a tag (nothing to learn)."""
    if not any(tags.values()):
        raise ValueError(
            f"{path}: none of its {len(tags)} image(s) has a tag, so every image would be learnt as background "
            "only; write each image's tags (in CSV after the comma that follows the image)"
        )


def tag_classes(tags: dict[str, list[str]]) -> list[str]:
    """``background`` followed by every tag of the file, sorted."""
    names = sorted({t for ts in tags.values() for t in ts})
    if "background" in names:
        names.remove("background")
    return ["background", *names]


def tag_warnings(tags: dict[str, list[str]], classes: list[str], min_images: int, path: str | Path) -> list[str]:
    """What to fix in a tags file before training on it, one ``warning: ...`` line each (empty if nothing):

    - classes whose names differ only in case or surrounding punctuation (``Disc``, ``disc``, ``disc.``): most
      likely one class written several ways, which would be learnt as separate classes;
    - classes (of ``classes`` and of the file, ``background`` aside) tagged on fewer than ``min_images`` images
      of the file, too few to learn them; ``min_images`` 0 checks none.

    Args:
        tags: ``{image: [tag, ...]}`` as :func:`read_tags` returns it.
        classes: The class list (background first).
        min_images: The fewest tagged images a class should have (``data.min_class_images``).
        path: The tags file, named in the warnings.
    """
    counts = Counter(t for names in tags.values() for t in names)
    names = sorted(set(classes) | set(counts))
    spellings: dict[str, list[str]] = {}
    for name in names:
        spellings.setdefault(name.strip(string.punctuation + string.whitespace).casefold(), []).append(name)
    out = [
        f"warning: {path}: classes {', '.join(map(repr, group))} differ only in case or surrounding punctuation; "
        "if they are one class, write it one way"
        for group in spellings.values()
        if len(group) > 1
    ]
    rare = [f"{name!r} ({counts[name]})" for name in names if name != "background" and counts[name] < min_images]
    if rare:
        out.append(
            f"warning: {path}: {len(rare)} class(es) are tagged on fewer than data.min_class_images={min_images} "
            f"images, too few to learn them: {', '.join(rare)}; tag more images of them or merge them into other "
            "classes"
        )
    return out


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
