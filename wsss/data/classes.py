"""Class lists and the VOC colour palette."""

from __future__ import annotations

from pathlib import Path

import numpy as np

VOC_CLASSES = (
    "background", "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow",
    "diningtable", "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train",
    "tvmonitor",
)  # fmt: skip


def voc_palette(num_colors: int = 256) -> np.ndarray:
    """The PASCAL VOC colour map: (num_colors, 3) uint8, index 255 included when num_colors is 256."""
    palette = np.zeros((num_colors, 3), dtype=np.uint8)
    for i in range(num_colors):
        c, r, g, b = i, 0, 0, 0
        for j in range(8):
            r |= ((c >> 0) & 1) << (7 - j)
            g |= ((c >> 1) & 1) << (7 - j)
            b |= ((c >> 2) & 1) << (7 - j)
            c >>= 3
        palette[i] = (r, g, b)
    return palette


def load_classes(classes: list[str] | tuple[str, ...] | str | Path) -> list[str]:
    """Resolve a class list: a list of names (background first) or a text file with one name per line.

    Raises:
        FileNotFoundError: ``classes`` names a file that does not exist.
        ValueError: Fewer than two classes, or duplicate names.
    """
    if isinstance(classes, (str, Path)):
        path = Path(classes)
        if not path.is_file():
            raise FileNotFoundError(
                f"class list file not found: {path}. Give data.classes as a list of names (background "
                "first) or a text file with one name per line."
            )
        names = [line.strip() for line in path.read_text().splitlines() if line.strip()]
        source = str(path)
    else:
        names = [str(c) for c in classes]
        source = "data.classes"
    if len(names) < 2:
        raise ValueError(f"{source}: need background plus at least one class, got {names}")
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"{source}: duplicate class names {dupes}")
    return names
