"""Unpack a tar (any compression) or zip archive safely and all-or-nothing.

Every member must be a regular file or a folder with a plain relative name: an absolute path, a ``..`` part, a
drive letter, a symbolic or hard link or a device stops the extraction, naming the member. The archive is unpacked
into ``DEST/.<archive name>.partial/`` and its top-level entries are renamed into ``DEST`` only once every member
is out, so an interrupted extraction leaves no folder that looks finished (the next run removes the partial one).

The disk keeps ``FetchOptions.min_free_bytes`` free: checked before unpacking (a zip's listed total; a tar's own
size, a lower bound for a compressed one) and again before each member by its real size (its header's, which is
what tarfile and zipfile write), so a gzip bomb stops before the member that would fill the disk.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tarfile
import zipfile
import zlib
from pathlib import Path, PurePosixPath

from tqdm import tqdm

from wsss.data.prepare.download import FetchOptions, PrepareError, ensure_free_space, room_problem

__all__ = ["extract_archive"]


def extract_archive(archive: Path, dest: Path, opts: FetchOptions) -> list[str]:
    """Unpack ``archive`` into ``dest``; returns the top-level names it made there.

    Raises:
        PrepareError: A member is unsafe, the archive is corrupt or of an unknown kind, the disk is full, or a
            top-level entry already exists in ``dest`` (the message names it).
    """
    dest.mkdir(parents=True, exist_ok=True)
    work = dest / f".{archive.name}.partial"
    shutil.rmtree(work, ignore_errors=True)  # a killed run's
    work.mkdir()
    try:
        try:
            if zipfile.is_zipfile(archive):
                _unzip(archive, work, opts)
            elif tarfile.is_tarfile(archive):
                _untar(archive, work, opts)
            else:
                raise PrepareError(f"{archive}: neither a tar nor a zip archive; delete it and run again")
        except (tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error) as err:
            raise PrepareError(f"{archive}: corrupt archive ({err}); delete it and run again") from None
        except OSError as err:
            if err.errno == errno.ENOSPC:
                raise PrepareError(f"{dest}: the disk is full while unpacking {archive.name}; free some space and "
                                   "run again") from None  # fmt: skip
            raise
        tops = sorted(os.listdir(work))
        for name in tops:
            if os.path.lexists(dest / name):
                raise PrepareError(f"{dest / name} exists but was not unpacked by this tool from {archive.name}; "
                                   "move it away and run again")  # fmt: skip
        for name in tops:
            os.replace(work / name, dest / name)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return tops


def member_problem(name: str) -> str | None:
    """Why an archive member name could land outside the extraction folder, or None if it cannot."""
    if not name or name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        return "an absolute path"
    if ".." in PurePosixPath(name.replace("\\", "/")).parts:
        return "a '..' part"
    return None


def _refuse(archive: Path, member: str, why: str) -> PrepareError:
    return PrepareError(f"{archive}: member {member!r} is {why}, which could write outside the extraction folder; "
                        "this is not the official archive: delete it and download it again")  # fmt: skip


def _ensure_room(archive: Path, work: Path, member: str, size: int, opts: FetchOptions) -> None:
    """Refuse to unpack ``member`` when its ``size`` bytes would leave under ``opts.min_free_bytes`` free."""
    if why := room_problem(work, size, opts):
        raise PrepareError(f"{work.parent}: unpacking {archive.name} stopped before member {member!r} ({size:,} "
                           f"bytes), {why}; free some space or choose another ROOT")  # fmt: skip


def _untar(archive: Path, work: Path, opts: FetchOptions) -> None:
    ensure_free_space(work, archive.stat().st_size, archive.name, opts)  # compressed size: a lower bound
    compressed = archive.suffix.lower() in (".tgz", ".gz", ".bz2", ".xz")
    with tarfile.open(archive) as tar, _bar(None if compressed else archive.stat().st_size, archive, opts) as bar:
        for member in tar:
            why = member_problem(member.name)
            if why is None and not (member.isreg() or member.isdir()):
                why = "a link" if member.issym() or member.islnk() else "a device or pipe"
            if why is not None:
                raise _refuse(archive, member.name, why)
            _ensure_room(archive, work, member.name, member.size, opts)
            if hasattr(tarfile, "data_filter"):  # Python >= 3.11.4: also drops setuid bits and the like
                tar.extract(member, work, filter="data")
            else:
                tar.extract(member, work)
            bar.update(member.size)


def _unzip(archive: Path, work: Path, opts: FetchOptions) -> None:
    with zipfile.ZipFile(archive) as zf:
        infos = zf.infolist()
        for info in infos:
            why = member_problem(info.filename)
            if why is None and stat.S_ISLNK(info.external_attr >> 16):
                why = "a link"
            if why is not None:
                raise _refuse(archive, info.filename, why)
        total = sum(i.file_size for i in infos)
        ensure_free_space(work, total, archive.name, opts)
        with _bar(total, archive, opts) as bar:
            for info in infos:
                _ensure_room(archive, work, info.filename, info.file_size, opts)
                zf.extract(info, work)
                bar.update(info.file_size)


def _bar(total: int | None, archive: Path, opts: FetchOptions) -> tqdm:
    return tqdm(total=total, desc=f"unpack {archive.name}", unit="B", unit_scale=True, unit_divisor=1024,
                disable=not opts.progress, leave=False)  # fmt: skip
