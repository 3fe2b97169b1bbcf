"""Where an image id may lead: the one resolver that training, ``tools/check_dataset.py`` and inference share.

An id (a line of a split file, a key of a tags or label file) is a path relative to its folder. It is refused when
it is empty, absolute (``/x``, ``C:x``, ``\\\\x``) or climbs with ``..``; Windows separators are read as ``/``
(``garden\\img_003.jpg`` is ``garden/img_003.jpg``). The file it names must resolve, symlinks followed, inside
the root, unless ``follow_symlinks`` and it is a symlink to a regular file.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

__all__ = ["UnsafePathError", "confined", "followable", "inside", "line_of", "safe_relative"]


class UnsafePathError(ValueError):
    """An id that is not a plain relative path, or a file that resolves outside its root."""


def safe_relative(name: str) -> str | None:
    """``name`` as a clean relative POSIX path, or None if it is empty, absolute or climbs with ``..``."""
    if not name or "\0" in name or name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        return None
    parts = PurePosixPath(name.replace("\\", "/")).parts
    if not parts or any(p in ("..", "") for p in parts):
        return None
    return PurePosixPath(*[p for p in parts if p != "."]).as_posix() or None


def inside(path: Path, root: Path) -> bool:
    """Whether ``path`` with every symlink resolved lies in the resolved ``root``."""
    return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(root))


def followable(path: Path, follow_symlinks: bool) -> bool:
    """Whether ``path``, which resolves outside its root, may be read anyway: with ``follow_symlinks``, a symlink
    to a regular file."""
    return follow_symlinks and path.is_symlink() and os.path.isfile(os.path.realpath(path))


def confined(path: Path, root: Path, follow_symlinks: bool, option: str) -> Path:
    """``path`` if it resolves inside ``root`` (or may be followed), else :class:`UnsafePathError` naming
    ``option``, the switch that allows it."""
    if inside(path, root) or followable(path, follow_symlinks):
        return path
    raise UnsafePathError(f"{path} resolves outside {root} ({os.path.realpath(path)}); {option} reads it")


def line_of(path: Path, text: str) -> int | None:
    """The 1-based number of the first line of ``path`` that contains ``text`` (for error messages)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return next((n for n, line in enumerate(f, 1) if text in line), None)
    except OSError:
        return None
