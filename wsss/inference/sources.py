"""Inference inputs and output paths: image folders, VOC splits, and path safety.

Input files whose resolved path (symlinks followed) lies outside the input folder (unless ``follow_symlinks``
and the file is a symlink to a regular file), split ids that are absolute or contain ``..``, and outputs whose
resolved path would lie outside OUTPUT (a symlinked output folder) are skipped with a reason. Files under
OUTPUT are never read as inputs when OUTPUT lies inside INPUT.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from wsss.data.folder import Skipped, scan_folder
from wsss.data.voc import IMAGE_SUFFIXES, read_split, resolve_split

__all__ = ["Source", "followable", "inside", "list_folder", "list_split", "output_paths", "safe_relative"]


@dataclass
class Source:
    """One input image: its path relative to the input base (POSIX) and its file."""

    rel: str
    path: Path


def inside(path: Path, root: Path) -> bool:
    """Whether ``path`` with every symlink resolved lies in the resolved ``root``."""
    return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(root))


def followable(path: Path, follow_symlinks: bool) -> bool:
    """Whether ``path``, which resolves outside its input folder, may be read anyway: with ``follow_symlinks``, a
    symlink to a regular file."""
    return follow_symlinks and path.is_symlink() and os.path.isfile(os.path.realpath(path))


def list_folder(
    root: str | Path, exclude: str | Path | None = None, follow_symlinks: bool = False
) -> tuple[list[Source], list[Skipped]]:
    """Image files under ``root`` (recursive, sorted; symlinked folders are not entered).

    Args:
        root: The input folder.
        exclude: A folder whose files are never inputs (the output folder, when it lies inside ``root``).
        follow_symlinks: Also read symlinks to regular files that resolve outside ``root``.

    Returns:
        The images, and the files skipped with their reasons: non-image files, and symlinks resolving
        outside ``root`` (unless ``follow_symlinks``).
    """
    root = Path(root)
    rels, skipped = scan_folder(root)
    sources = []
    for rel in rels:
        path = root / rel
        if exclude is not None and inside(path, exclude) and inside(Path(exclude), root):
            continue
        if not inside(path, root) and not followable(path, follow_symlinks):
            reason = f"resolves outside the input folder ({os.path.realpath(path)}); --follow-symlinks reads it"
            skipped.append(Skipped(rel, reason))
            continue
        sources.append(Source(PurePosixPath(Path(rel)).as_posix(), path))
    return sources, skipped


def safe_relative(name: str) -> str | None:
    """``name`` as a clean relative POSIX path, or None if it is empty, absolute or climbs with ``..``."""
    if not name or "\0" in name or name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        return None
    parts = PurePosixPath(name.replace("\\", "/")).parts
    if not parts or any(p in ("..", "") for p in parts):
        return None
    return PurePosixPath(*[p for p in parts if p != "."]).as_posix() or None


def list_split(
    root: str | Path, split: str, follow_symlinks: bool = False
) -> tuple[list[Source], list[Skipped]]:
    """Images of a VOC-layout root listed by a split (a name under ``ImageSets/Segmentation`` or a file).

    Ids are looked up as ``JPEGImages/<id>{.jpg,.jpeg,.png}``; relative paths are taken from JPEGImages.
    Ids that are absolute or contain ``..``, ids without an image, and images resolving outside
    JPEGImages (unless ``follow_symlinks`` and a symlink to a regular file) are skipped with a reason.
    """
    base = Path(root) / "JPEGImages"
    if not base.is_dir():
        raise FileNotFoundError(f"{root} has no JPEGImages/ folder; with --split, INPUT must be a VOC-layout root")
    sources, skipped, seen = [], [], set()
    for image_id in read_split(resolve_split(Path(root), split)):
        rel_id = safe_relative(image_id)
        if rel_id is None:
            skipped.append(Skipped(image_id, "unsafe id in the split file (absolute, empty or with '..')"))
            continue
        path = next((base / f"{rel_id}{ext}" for ext in IMAGE_SUFFIXES if (base / f"{rel_id}{ext}").is_file()), None)
        if path is None:
            skipped.append(Skipped(image_id, f"no image JPEGImages/{rel_id}{{{','.join(IMAGE_SUFFIXES)}}}"))
        elif not inside(path, base) and not followable(path, follow_symlinks):
            reason = f"resolves outside JPEGImages ({os.path.realpath(path)}); --follow-symlinks reads it"
            skipped.append(Skipped(image_id, reason))
        elif rel_id not in seen:
            seen.add(rel_id)
            sources.append(Source(path.relative_to(base).as_posix(), path))
    return sources, skipped


def output_paths(output: Path, rel: str, kinds: Iterable[str]) -> dict[str, Path]:
    """Output file of each kind (``masks``, ``labels``, ``overlays``, ``cams``, ``logits``, ``thumbs``, ``gt``) for
    input ``rel``."""
    suffix = {
        "masks": ".png", "labels": ".json", "overlays": ".jpg", "cams": ".jpg", "logits": ".npy", "thumbs": ".jpg",
        "gt": ".jpg",
    }  # fmt: skip
    stem = PurePosixPath(rel).with_suffix("")
    return {k: output / k / f"{stem}{suffix[k]}" for k in kinds}
