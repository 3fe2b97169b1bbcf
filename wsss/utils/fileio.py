"""File I/O shared by every stage: atomic writes, robust image reading, mask PNGs.

Everything written goes to a temporary file in the destination folder and is renamed into place, so an
interrupted run never leaves a half-written output or checkpoint. The temporary's name carries a mark only this
project writes, ``.<name>.wsss-<host>-<pid>-<random>.tmp``: ``<name>`` is the file's name cut to
:data:`TEMPORARY_NAME_BYTES` bytes (so any name that fits the file system has a temporary that fits too),
``<host>`` a hash of the writer's host name and ``<pid>`` its process id. :func:`remove_stale_temporaries` deletes
only files with that mark, written on this host by a process that is gone: a live run's temporaries, another
host's (on a shared folder) and every other file, whatever its name, are kept. Callers pass it only folders the
project writes (an inference OUTPUT's own folders, a training work dir), never a user's.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import socket
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageOps

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp", ".ppm", ".pgm")

TEMPORARY_NAME_BYTES = 64
"""Bytes of the destination's name kept in its temporary's name (the rest of the name is at most 40 bytes)."""
_TEMPORARY = re.compile(r"\..*\.wsss-([0-9a-f]{8})-(\d+)-[a-z0-9_]+\.tmp", re.DOTALL)
"""Name of an :func:`atomic_open` temporary; group 1 is the writer's host (:func:`host_mark`), group 2 its pid."""
_COPY_BAND_BYTES = 1 << 24
"""Bytes of decoded pixels copied per band into a new array (bounds the temporary copies of a huge image)."""


@contextmanager
def atomic_open(path: str | Path, mode: str = "wb") -> Iterator[Any]:
    """Open a temporary file beside ``path``; on success rename it onto ``path``, on error delete it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=temporary_prefix(path.name), suffix=".tmp")
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600 files; give outputs the usual permissions
    try:
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def host_mark(host: str | None = None) -> str:
    """8 hex digits naming ``host`` (default: this machine's host name) in temporaries' names."""
    return hashlib.sha256((host or socket.gethostname()).encode("utf-8", "surrogateescape")).hexdigest()[:8]


def temporary_prefix(name: str, pid: int | None = None, host: str | None = None) -> str:
    """The start of the name of :func:`atomic_open`'s temporary for a file ``name`` written by process ``pid``
    (default: this one) on ``host`` (default: this one); ``tempfile`` adds random letters and ``.tmp``."""
    short = os.fsdecode(os.fsencode(name)[:TEMPORARY_NAME_BYTES])
    return f".{short}.wsss-{host_mark(host)}-{os.getpid() if pid is None else pid}-"


def remove_stale_temporaries(folder: str | Path, recursive: bool = False) -> list[Path]:
    """Delete the :func:`atomic_open` temporaries under ``folder`` that a process of this host left behind when it
    was killed; nothing else (see the module docstring). Give only folders the project writes.

    Args:
        folder: Where to look (a missing folder holds none).
        recursive: Also look in subfolders (symlinked folders are not entered).

    Returns:
        The deleted files.
    """
    removed, here = [], host_mark()
    for dirpath, dirnames, filenames in os.walk(folder):
        if not recursive:
            dirnames.clear()
        for name in filenames:
            match = _TEMPORARY.fullmatch(name)
            if match and match.group(1) == here and not _process_alive(int(match.group(2))):
                path = Path(dirpath) / name
                path.unlink(missing_ok=True)
                removed.append(path)
    return removed


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    with atomic_open(path, "wb") as f:
        f.write(data)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_torch_save(obj: Any, path: str | Path) -> None:
    """``torch.save`` to ``path`` atomically."""
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    atomic_write_bytes(path, buf.getvalue())


def regular_file_problem(path: str | Path) -> str | None:
    """None if ``path`` (symlinks followed) is a regular file, else why not: ``not a regular file (named
    pipe)`` and the like. Opening a named pipe blocks until a writer comes, so readers check first.

    Raises:
        OSError: ``path`` cannot be examined (missing, broken link, no permission).
    """
    mode = os.stat(path).st_mode
    if stat.S_ISREG(mode):
        return None
    kinds = {stat.S_ISFIFO: "named pipe", stat.S_ISDIR: "folder", stat.S_ISSOCK: "socket",
             stat.S_ISCHR: "character device", stat.S_ISBLK: "block device"}  # fmt: skip
    kind = next((name for test, name in kinds.items() if test(mode)), "special file")
    return f"not a regular file ({kind})"


def read_image(path: str | Path, max_pixels: int = 0) -> np.ndarray:
    """Read any image as (H, W, 3) uint8 RGB, with its EXIF orientation applied.

    Grayscale, palette, RGBA (composited on black) and 16-bit images are converted.

    Args:
        path: The image file.
        max_pixels: Refuse, before decoding, an image with more pixels than this (0: no cap); the error names
            ``data.max_image_pixels``, the config key every caller passes.

    Raises:
        ValueError: The file is missing, not a regular file, not an image, truncated, or over ``max_pixels``;
            the message names the path.
    """
    path = Path(path)
    try:
        problem = regular_file_problem(path)
    except FileNotFoundError:
        raise ValueError(f"{path}: file not found") from None
    except OSError as err:
        raise ValueError(f"{path}: cannot be read ({err.strerror})") from None
    if problem:
        raise ValueError(f"{path}: {problem}")
    try:
        with Image.open(path) as im:
            if max_pixels and im.width * im.height > max_pixels:
                raise ValueError(
                    f"{path}: {im.width}x{im.height} is {im.width * im.height:,} pixels, over data.max_image_pixels = "
                    f"{max_pixels:,}; downscale the image or raise data.max_image_pixels (0: no cap)"
                )
            im.load()
            ImageOps.exif_transpose(im, in_place=True)  # a copy otherwise, even when there is nothing to turn
            return image_to_rgb(im)
    except FileNotFoundError:
        raise ValueError(f"{path}: file not found") from None
    except (OSError, SyntaxError, Image.DecompressionBombError) as err:
        raise ValueError(f"{path}: not a readable image ({err})") from None


def image_to_rgb(im: Image.Image) -> np.ndarray:
    """A PIL image of any mode as (H, W, 3) uint8 RGB: grayscale and palette expanded, RGBA composited on black,
    16-bit and float scaled by their maximum to [0, 255]."""
    if im.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
        arr = np.asarray(im, dtype=np.float64)
        hi = arr.max()
        arr = arr / hi * 255.0 if hi > 0 else arr
        return np.repeat(np.round(arr).astype(np.uint8)[..., None], 3, axis=2)
    if im.mode in ("RGBA", "LA", "PA") or (im.mode == "P" and "transparency" in im.info):
        im = im.convert("RGBA")
        rgb = np.asarray(im, dtype=np.float32)
        out = rgb[..., :3] * (rgb[..., 3:] / 255.0)
        return np.round(out).astype(np.uint8)
    if im.mode != "RGB":
        im = im.convert("RGB")
    out = np.empty((im.height, im.width, 3), np.uint8)  # filled a band at a time: one copy of a huge image, not 3
    rows = max(1, _COPY_BAND_BYTES // (3 * max(1, im.width)))
    for top in range(0, im.height, rows):
        out[top : top + rows] = np.asarray(im.crop((0, top, im.width, min(top + rows, im.height))))
    return out


def read_mask(path: str | Path) -> np.ndarray:
    """Read a label PNG (palette or grayscale index image) as (H, W) uint8 class indices.

    Raises:
        ValueError: The file is missing, unreadable, or an RGB colour image rather than an index image.
    """
    path = Path(path)
    try:
        with Image.open(path) as im:
            im.load()
            if im.mode not in ("P", "L", "I", "I;16"):
                raise ValueError(
                    f"{path}: mask is a {im.mode} image; expected a palette or grayscale PNG of class "
                    "indices (255 = ignore). Convert colour masks to index masks first."
                )
            arr = np.array(im)
    except FileNotFoundError:
        raise ValueError(f"{path}: mask file not found") from None
    except OSError as err:
        raise ValueError(f"{path}: not a readable mask ({err})") from None
    if arr.dtype != np.uint8:
        if arr.max() > 255:
            raise ValueError(f"{path}: mask values up to {arr.max()} do not fit class indices 0..255")
        arr = arr.astype(np.uint8)
    return arr


def save_mask(path: str | Path, mask: np.ndarray, palette: np.ndarray | None = None) -> None:
    """Write (H, W) class indices as an index PNG (with ``palette`` (N, 3) uint8 if given), atomically."""
    mask = np.ascontiguousarray(mask, dtype=np.uint8)
    if mask.ndim != 2:
        raise ValueError(f"{path}: mask must be (H, W), got shape {mask.shape}")
    im = Image.frombytes("P" if palette is not None else "L", (mask.shape[1], mask.shape[0]), mask.tobytes())
    if palette is not None:
        im.putpalette(np.asarray(palette, dtype=np.uint8).reshape(-1).tolist())
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    atomic_write_bytes(path, buf.getvalue())


def save_image(path: str | Path, image: np.ndarray, quality: int = 95) -> None:
    """Write (H, W, 3) uint8 RGB as JPEG or PNG (by extension), atomically."""
    path = Path(path)
    fmt = "JPEG" if path.suffix.lower() in (".jpg", ".jpeg") else "PNG"
    buf = io.BytesIO()
    Image.fromarray(np.asarray(image, dtype=np.uint8)).save(buf, format=fmt, quality=quality)
    atomic_write_bytes(path, buf.getvalue())
