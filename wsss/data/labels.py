"""Image-level labels: parsed from VOC XML annotations or from segmentation masks, stored as one JSON file.

The label file maps each image id to a multi-hot list over the C-1 foreground classes (background
excluded) and records the class names it was made for, so a mismatch with the config is caught.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
from tqdm import tqdm

from wsss.utils.fileio import atomic_write_text, read_mask

MASK_DIRS = ("SegmentationClassAug", "SegmentationClass")
"""Mask folders looked for under a VOC-layout root, in this order, when none is named."""


def parse_voc_xml(path: str | Path) -> list[str]:
    """Every ``<object><name>`` in a VOC annotation file, difficult objects included.

    Raises:
        ValueError: The file is not valid XML or has an object without a name.
    """
    path = Path(path)
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as err:
        raise ValueError(f"{path}: not a valid VOC annotation XML ({err})") from None
    names = []
    for obj in root.iter("object"):
        name = obj.findtext("name")
        if name is None or not name.strip():
            raise ValueError(f"{path}: an <object> has no <name>")
        names.append(name.strip())
    return names


def multi_hot(indices: list[int] | np.ndarray, num_fg: int) -> np.ndarray:
    """(num_fg,) uint8 vector with ones at the given foreground indices (0-based, background excluded)."""
    vec = np.zeros(num_fg, dtype=np.uint8)
    vec[np.asarray(indices, dtype=np.int64)] = 1
    return vec


def labels_from_xml(ann_dir: str | Path, classes: list[str], progress: bool = True) -> dict[str, np.ndarray]:
    """Labels for every ``<id>.xml`` in ``ann_dir``.

    Args:
        ann_dir: The ``Annotations`` folder.
        classes: Class names, background first.
        progress: Show a progress bar.

    Raises:
        FileNotFoundError: ``ann_dir`` is missing or holds no XML file.
        ValueError: An object name is not in ``classes`` (the message names the file and the fix).
    """
    ann_dir = Path(ann_dir)
    files = sorted(ann_dir.glob("*.xml")) if ann_dir.is_dir() else []
    if not files:
        raise FileNotFoundError(f"no annotation XML files in {ann_dir}; use --source masks if you have none")
    index = {name: i - 1 for i, name in enumerate(classes) if i > 0}
    labels = {}
    for path in tqdm(files, desc="xml labels", unit="file", leave=False, disable=not progress):
        names = parse_voc_xml(path)
        unknown = sorted(set(names) - set(index))
        if unknown:
            raise ValueError(
                f"{path}: object class(es) {unknown} not in the class list {classes[1:]}. "
                "Pass the right list with --classes FILE."
            )
        labels[path.stem] = multi_hot([index[n] for n in names], len(classes) - 1)
    return labels


def labels_from_masks(
    mask_dir: str | Path, num_classes: int, ignore_index: int = 255, progress: bool = True
) -> dict[str, np.ndarray]:
    """Labels for every ``<id>.png`` in ``mask_dir``: the foreground classes present in the mask (``progress``: a
    progress bar).

    Raises:
        FileNotFoundError: ``mask_dir`` is missing or holds no PNG.
        ValueError: A mask holds a value outside ``[0, num_classes)`` and ``ignore_index``.
    """
    mask_dir = Path(mask_dir)
    files = sorted(mask_dir.glob("*.png")) if mask_dir.is_dir() else []
    if not files:
        raise FileNotFoundError(f"no mask PNG files in {mask_dir}")
    labels = {}
    for path in tqdm(files, desc="mask labels", unit="file", leave=False, disable=not progress):
        values = np.unique(read_mask(path))
        check_mask_values(values, num_classes, ignore_index, path)
        fg = values[(values > 0) & (values != ignore_index)].astype(np.int64) - 1
        labels[path.stem] = multi_hot(fg, num_classes - 1)
    return labels


def under_root(root: str | Path, name: str | Path) -> Path:
    """``name`` as given when absolute or existing (relative to the working directory), else under ``root``."""
    path = Path(name)
    return path if path.is_absolute() or path.exists() else Path(root) / path


def find_mask_dir(root: str | Path, preferred: str | None = None) -> Path:
    """The first of ``preferred`` and :data:`MASK_DIRS` under ``root`` that holds a PNG.

    Raises:
        FileNotFoundError: None of them does (the message lists where it looked and the fix).
    """
    root = Path(root)
    names = list(dict.fromkeys([preferred, *MASK_DIRS] if preferred else MASK_DIRS))
    for name in names:
        if (root / name).is_dir() and next((root / name).glob("*.png"), None) is not None:
            return root / name
    raise FileNotFoundError(
        f"no mask PNG files in {', '.join(str(root / n) for n in names)}; name the mask folder with --mask-dir"
    )


def make_label_file(
    root: str | Path,
    source: str,
    classes: list[str],
    out: str | Path,
    mask_dir: str | None,
    ignore_index: int,
    progress: bool = True,
) -> tuple[int, Path]:
    """Write the label file of a VOC-layout dataset (what ``tools/make_cls_labels.py`` does).

    Args:
        root: The dataset root.
        source: ``xml`` (``root/Annotations``) or ``masks``.
        classes: Class names, background first.
        out: The label file to write.
        mask_dir: Mask folder under root for ``masks``; None or missing: :func:`find_mask_dir` looks.
        ignore_index: Mask value that is not a class.
        progress: Show a progress bar.

    Returns:
        ``(number of images, the folder read)``.
    """
    root = Path(root)
    if source == "xml":
        folder = root / "Annotations"
        labels = labels_from_xml(folder, classes, progress)
    else:
        folder = find_mask_dir(root, mask_dir)
        labels = labels_from_masks(folder, len(classes), ignore_index, progress)
    save_labels(out, labels, classes)
    return len(labels), folder


def check_mask_values(values: np.ndarray, num_classes: int, ignore_index: int, path: str | Path) -> None:
    """Raise ValueError naming ``path`` if any value lies outside ``[0, num_classes)`` and ``ignore_index``."""
    values = np.unique(values)
    bad = values[(values >= num_classes) & (values != ignore_index)]
    if bad.size:
        raise ValueError(
            f"{path}: label values {bad.tolist()} are outside [0, {num_classes}) and ignore {ignore_index}. "
            "Check data.classes (its length sets the number of classes) or the mask files."
        )


def save_labels(path: str | Path, labels: dict[str, np.ndarray], classes: list[str]) -> None:
    """Write labels as JSON ``{"classes": [...], "labels": {id: [0/1, ...]}}`` atomically."""
    payload = {
        "classes": list(classes),
        "labels": {k: [int(v) for v in labels[k]] for k in sorted(labels)},
    }
    atomic_write_text(path, json.dumps(payload, indent=0, separators=(",", ":")) + "\n")


def load_labels(path: str | Path, classes: list[str]) -> dict[str, np.ndarray]:
    """Read a label file written by :func:`save_labels` and check it was made for ``classes``.

    Raises:
        FileNotFoundError: The file is missing (the message says how to create it).
        ValueError: The file was made for another class list, or is malformed (an entry other than 0 or 1
            included); the message names the file and the image id.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"image-level label file not found: {path}. Create it with "
            f"`python tools/make_cls_labels.py VOC_ROOT --out {path}`."
        )
    try:
        payload = json.loads(path.read_text())
        stored, raw = payload["classes"], payload["labels"]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise ValueError(
            f"{path}: not a wsss label file ({err}); regenerate it with tools/make_cls_labels.py"
        ) from None
    if list(stored) != list(classes):
        raise ValueError(
            f"{path}: made for classes {stored}, but the config has {list(classes)}. "
            "Regenerate it with tools/make_cls_labels.py --classes, or fix data.classes."
        )
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: 'labels' must map image ids to lists; regenerate it with tools/make_cls_labels.py")
    labels = {}
    for key, vec in raw.items():
        if not isinstance(vec, list) or len(vec) != len(classes) - 1:
            count = f"{len(vec)} entries" if isinstance(vec, list) else f"a {type(vec).__name__}"
            raise ValueError(f"{path}: label of '{key}' has {count}, expected a list of {len(classes) - 1}")
        bad = [v for v in vec if type(v) is not int or v not in (0, 1)]  # bool, float, NaN, -1, 2 ...
        if bad:
            raise ValueError(
                f"{path}: label of '{key}' holds {json.dumps(bad[0])}; only 0 and 1 are accepted (absent, present). "
                "Fix the entry or regenerate the file with tools/make_cls_labels.py."
            )
        labels[key] = np.asarray(vec, dtype=np.uint8)
    return labels
