"""Image-folder dataset for inference: recursive, any size, bad files reported and skipped."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from torch.utils.data import Dataset

from wsss.utils.fileio import IMAGE_EXTENSIONS, read_image, regular_file_problem


@dataclass
class Skipped:
    """A file that was not processed, and why."""

    path: str
    reason: str


def scan_folder(root: str | Path) -> tuple[list[str], list[Skipped]]:
    """Relative paths of image files under ``root`` (recursive, sorted) and the other files skipped.

    Hidden files and folders (name starting with '.') are ignored silently. Anything that is not a regular
    file once symlinks are followed (a named pipe, a device, a socket, a broken link) is skipped with the
    reason: reading a named pipe would block forever.

    Raises:
        FileNotFoundError: ``root`` is not a folder.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"input folder not found: {root}")
    images, skipped = [], []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if name.startswith("."):
                continue
            rel = os.path.relpath(os.path.join(dirpath, name), root)
            if Path(name).suffix.lower() not in IMAGE_EXTENSIONS:
                skipped.append(Skipped(rel, f"not an image file (extension '{Path(name).suffix}')"))
                continue
            try:
                not_regular = regular_file_problem(os.path.join(dirpath, name))
            except OSError as err:
                not_regular = f"cannot be read ({err.strerror})"
            if not_regular:
                skipped.append(Skipped(rel, not_regular))
            else:
                images.append(rel)
    return images, skipped


class ImageFolderDataset(Dataset):
    """Every image under a folder, as (H, W, 3) uint8 RGB with EXIF orientation applied.

    Each item is a dict ``{"path": relative path, "image": array or None, "error": None or reason}``;
    a corrupt file yields ``image=None`` and the reason, so the caller reports it and moves on.
    """

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.files, self.skipped = scan_folder(self.root)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> dict:
        rel = self.files[index]
        try:
            image: np.ndarray | None = read_image(self.root / rel)
            error = None
        except ValueError as err:
            image, error = None, str(err).split(": ", 1)[-1]
        return {"path": rel, "image": image, "error": error}
