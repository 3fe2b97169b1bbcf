"""Inference inputs and output paths: image folders, VOC splits, and path safety.

Input files whose resolved path (symlinks followed) lies outside the input folder (unless ``follow_symlinks``
and the file is a symlink to a regular file), split ids that are absolute or contain ``..``, and outputs whose
resolved path would lie outside OUTPUT (a symlinked output folder) are skipped with a reason. Files under
OUTPUT are never read as inputs when OUTPUT lies inside INPUT: those of its own folders are left out, any other
image there is skipped with its reason.

An output never lands on an input: OUTPUT equal to INPUT, or INPUT inside one of OUTPUT's output folders
(``proj/thumbs`` with OUTPUT ``proj``), is refused before anything is written
(:meth:`~wsss.inference.folder.layout.OutputLayout.check_input`), and an image one of whose output paths is an input
file (a link followed with ``follow_symlinks``) is skipped (:func:`input_files`, :func:`overwritten_input`).
Outputs are written through :func:`writing`, which names the file that failed (a full disk) in one line.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from PIL import Image

from wsss.data.folder import Skipped, scan_folder
from wsss.data.paths import followable, inside, safe_relative
from wsss.data.voc import IMAGE_SUFFIXES, read_split, resolve_split
from wsss.inference.folder.layout import OutputLayout
from wsss.utils.distributed import all_gather_objects, balanced_shards, rank_and_world

__all__ = [
    "FULL_DISK", "OutputError", "Source", "followable", "image_pixels", "input_files", "inside", "list_file",
    "list_folder", "list_split", "overwritten_input", "own_shard", "safe_relative", "save_output", "writing",
]  # fmt: skip

FULL_DISK = (errno.ENOSPC, errno.EDQUOT)
"""The errors of a write to a full disk (or a full quota)."""


@dataclass
class Source:
    """One input image: its path relative to the input base (POSIX) and its file."""

    rel: str
    path: Path


def image_pixels(path: str | Path) -> int:
    """Width x height of an image from its header (nothing is decoded); 0 when it cannot be read."""
    try:
        with Image.open(path) as im:
            return im.width * im.height
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError):
        return 0


def own_shard(sources: list[Source]) -> list[Source]:
    """This rank's share of ``sources`` under ``torchrun`` (all of them in one process).

    Every rank must call it with the same sorted list. Each reads the headers of every ``world``-th image, the
    pixel counts are gathered, and :func:`~wsss.utils.distributed.balanced_shards` splits the list by pixels
    (largest first to the least loaded rank): the same split on every rank, whatever any rank has already
    written, so each image belongs to exactly one rank. A rank may get none.
    """
    rank, world = rank_and_world()
    if world == 1:
        return sources
    mine = {i: image_pixels(sources[i].path) for i in range(rank, len(sources), world)}
    pixels = {i: n for part in all_gather_objects(mine) for i, n in part.items()}
    shard = balanced_shards([pixels[i] for i in range(len(sources))], world)[rank]
    return [sources[i] for i in shard]


def list_folder(
    root: str | Path, output: OutputLayout | None = None, follow_symlinks: bool = False
) -> tuple[list[Source], list[Skipped]]:
    """Image files under ``root`` (recursive, sorted; symlinked folders are not entered).

    Args:
        root: The input folder.
        output: The output folder, whose files are never inputs when it lies inside ``root``: those of its own
            folders and run files are left out, any other is skipped.
        follow_symlinks: Also read symlinks to regular files that resolve outside ``root``.

    Returns:
        The images, and the files skipped with their reasons: non-image files, images in the output folder, and
        symlinks resolving outside ``root`` (unless ``follow_symlinks``).
    """
    root = Path(root)
    rels, skipped = scan_folder(root)
    sources = []
    nested = output is not None and inside(output.root, root)
    if nested:  # the run files and outputs are not inputs
        skipped = [s for s in skipped if not output.owns(root / s.path)]
    for rel in rels:
        path = root / rel
        if nested and inside(path, output.root):
            if not output.owns(path):
                reason = f"lies in the output folder {output.root}, never read as an input; move it out of OUTPUT"
                skipped.append(Skipped(rel, reason))
            continue
        if not inside(path, root) and not followable(path, follow_symlinks):
            reason = f"resolves outside the input folder ({os.path.realpath(path)}); --follow-symlinks reads it"
            skipped.append(Skipped(rel, reason))
            continue
        sources.append(Source(PurePosixPath(Path(rel)).as_posix(), path))
    return sources, skipped


def list_file(
    root: str | Path, listing: str | Path, follow_symlinks: bool = False
) -> tuple[list[Source], list[Skipped]]:
    """Images under ``root`` named by a text file (``--list``): one path per line, relative to ``root`` or absolute
    inside it; blank lines and lines starting with ``#`` are ignored, Windows separators read as ``/``. Lines end
    at ``\n`` only (a name may hold any other character, U+2028 included), so line numbers are the editor's.

    Lines that are unsafe (climbing out with ``..``, absolute outside ``root``), name no regular file, or resolve
    outside ``root`` (unless ``follow_symlinks`` and a symlink to a regular file) are skipped with a reason
    naming the line; a path listed twice is read once, and another path to a file already listed (through a
    symlinked folder, a folder loop) is skipped naming the first.

    Raises:
        FileNotFoundError: ``root`` or ``listing`` is missing.
        ValueError: ``listing`` is not UTF-8 text (one line naming it).
    """
    root, listing = Path(root), Path(listing)
    if not listing.is_file():
        raise FileNotFoundError(f"--list: file not found: {listing}")
    try:
        lines = listing.read_text(encoding="utf-8-sig").split("\n")
    except UnicodeDecodeError as err:
        raise ValueError(f"{listing}: --list must be UTF-8 text, one image path per line ({err.reason})") from None
    sources, skipped, seen, files = [], [], set(), {}
    for number, line in enumerate(lines, 1):
        name = line.strip(" \t\r")
        if not name or name.startswith("#"):
            continue
        where = f"{listing}:{number}"
        if os.path.isabs(name) and Path(os.path.abspath(name)).is_relative_to(os.path.abspath(root)):
            name = Path(os.path.abspath(name)).relative_to(os.path.abspath(root)).as_posix()
        rel = safe_relative(name)
        if rel is None:
            skipped.append(Skipped(name, f"{where}: not a path inside the input folder {root}"))
            continue
        path = root / rel
        if not path.is_file():
            skipped.append(Skipped(rel, f"{where}: no such file under {root}"))
        elif not inside(path, root) and not followable(path, follow_symlinks):
            outside = f"resolves outside the input folder ({os.path.realpath(path)})"
            skipped.append(Skipped(rel, f"{where}: {outside}; --follow-symlinks reads it"))
        elif rel not in seen:
            seen.add(rel)
            first = files.setdefault(os.path.realpath(path), (rel, number))
            if first[0] == rel:
                sources.append(Source(rel, path))
            else:
                skipped.append(Skipped(rel, f"{where}: the same file as {first[0]} (line {first[1]}), read once"))
    return sources, skipped


def list_split(root: str | Path, split: str, follow_symlinks: bool = False) -> tuple[list[Source], list[Skipped]]:
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


def save_output(path: Path, save: Callable[..., None], *args: Any) -> None:
    """``save(path, *args)``, an OSError raised as :class:`OutputError` naming ``path``."""
    with writing(path):
        save(path, *args)


def input_files(paths: Iterable[Path]) -> dict[tuple[int, int], Path]:
    """The files behind ``paths`` (symlinks followed), by identity (device, inode); missing ones are left out."""
    found = {}
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            continue
        found[(st.st_dev, st.st_ino)] = path
    return found


def overwritten_input(path: Path, inputs: dict[tuple[int, int], Path]) -> Path | None:
    """The input (of :func:`input_files`) that writing ``path`` would replace, or None."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return inputs.get((st.st_dev, st.st_ino))


class OutputError(OSError):
    """An output could not be written (a full disk, no permission). ``str()`` is one line naming the file.

    Args:
        path: The file that failed.
        error: The OSError writing raised.
        consequence: What it means for the run (what was kept, what to do); by default that nothing was written
            to ``path``.
    """

    def __init__(self, path: str | Path, error: OSError, consequence: str = "") -> None:
        full = error.errno in FULL_DISK
        why = f"the disk is full ({error.strerror})" if full else (error.strerror or str(error))
        then = consequence or "nothing was written there" + ("; free space and run again" if full else "")
        super().__init__(error.errno, f"cannot write {path}: {why}; {then}")
        self.path, self.error, self.consequence = Path(path), error, consequence

    def __str__(self) -> str:
        return self.strerror

    def __reduce__(self) -> tuple:  # whole through pickle: ranks gather each other's errors
        return type(self), (self.path, self.error, self.consequence)


@contextmanager
def writing(path: str | Path) -> Iterator[None]:
    """Writes of ``path`` inside the block raise :class:`OutputError` naming it instead of a bare OSError."""
    try:
        yield
    except OutputError:
        raise
    except OSError as err:
        raise OutputError(path, err) from err
