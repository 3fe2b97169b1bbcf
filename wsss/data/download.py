"""Fetch a dataset archive and prove it intact: found in a folder the user has, or downloaded (resumed with HTTP
Range after an interruption), then checked against its published MD5, or its size where none is published.

Every failure is one :class:`PrepareError` line naming the file and the fix: a bad checksum, a full disk, no
network (the connection attempt gives up after ``FetchOptions.connect_timeout`` seconds), a stalled or cut
download. A download grows in ``<name>.part`` beside its destination and takes its final name only once verified,
so a file with the archive's name is always a whole, checked one.
"""

from __future__ import annotations

import errno
import hashlib
import http.client
import json
import os
import shutil
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from wsss.utils.fileio import atomic_write_text

__all__ = ["Archive", "FetchOptions", "PrepareError", "fetch_archive", "file_md5", "read_checksums"]


class PrepareError(Exception):
    """A data-preparation step cannot go on; the message is one line naming the file and the fix."""


@dataclass(frozen=True)
class Archive:
    """One archive of a dataset: its file name, its official address and what an intact copy looks like."""

    name: str
    url: str
    md5: str | None = None
    """Published MD5 (hex); None where the publisher gives none (then only ``size`` is checked)."""
    size: int | None = None
    """Size in bytes; checked when given (and always when there is no MD5)."""


@dataclass(frozen=True)
class FetchOptions:
    """Where archives come from and how downloads behave."""

    archive_dir: Path | None = None
    """Folder of archives the user already has (looked in first, read in place, never written)."""
    mirror: str | None = None
    """Base URL serving the archives under their file names, used instead of each official address."""
    connect_timeout: float = 10.0
    """Seconds before an unanswered connection or a stalled transfer is given up."""
    chunk_bytes: int = 1 << 20
    """Bytes read from the network (and hashed) at a time."""
    min_free_bytes: int = 1 << 30
    """Space to leave free on the disk: a download or an extraction that would leave less is refused up front."""
    progress: bool = True


def fetch_archive(archive: Archive, download_dir: Path, opts: FetchOptions, verified_dir: Path | None = None) -> Path:
    """The path of an intact copy of ``archive``: from ``opts.archive_dir``, else ``download_dir``, else downloaded.

    A copy already verified (its size and modification time recorded in ``verified_dir``, by default
    ``download_dir/.verified``) is not hashed again.

    Raises:
        PrepareError: The copy is corrupt, the disk is full, the server cannot be reached or the transfer broke.
    """
    if opts.archive_dir is not None and (Path(opts.archive_dir) / archive.name).is_file():
        path = Path(opts.archive_dir) / archive.name
        fix = f"replace it with an intact copy from {archive.url}, or remove it to download one"
    else:
        path = download_dir / archive.name
        fix = "delete it and run again to download it afresh"
        if not path.is_file():
            _download(archive, source_url(archive, opts), download_dir, opts)
    record = (verified_dir or download_dir / ".verified") / f"{archive.name}.json"
    stat = path.stat()
    seen = {"path": str(path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "md5": archive.md5}
    if record.is_file() and json.loads(record.read_text()) == seen:
        return path
    verify(path, archive, fix, opts)
    atomic_write_text(record, json.dumps(seen) + "\n")
    return path


def source_url(archive: Archive, opts: FetchOptions) -> str:
    """``opts.mirror``/name when a mirror is given, else the official address."""
    return f"{opts.mirror.rstrip('/')}/{archive.name}" if opts.mirror else archive.url


def verify(path: Path, archive: Archive, fix: str, opts: FetchOptions) -> None:
    """Check ``path`` against the archive's size and MD5; ``fix`` ends the error line."""
    size = path.stat().st_size
    if archive.size is not None and size != archive.size:
        raise PrepareError(f"{path}: {size:,} bytes, but {archive.name} has {archive.size:,}; {fix}")
    if archive.md5 is not None:
        got = file_md5(path, opts)
        if got != archive.md5.lower():
            raise PrepareError(f"{path}: MD5 {got} is not the published {archive.md5} (corrupt or another file); {fix}")


def file_md5(path: Path, opts: FetchOptions) -> str:
    """Hex MD5 of a file, read ``opts.chunk_bytes`` at a time, with a progress bar."""
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f, _bar(path.stat().st_size, 0, f"md5 {path.name}", opts) as bar:
        while chunk := f.read(opts.chunk_bytes):
            digest.update(chunk)
            bar.update(len(chunk))
    return digest.hexdigest()


def read_checksums(path: Path, archives: tuple[Archive, ...]) -> tuple[Archive, ...]:
    """``archives`` with the MD5s of an ``md5sum``-format file (``<md5>  <name>`` per line) in place of theirs.

    A listed archive's size is no longer checked: the MD5 given is the stronger proof.

    Raises:
        PrepareError: A line is malformed or names no archive of the dataset (the message gives file:line).
    """
    by_name = {a.name: a for a in archives}
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        md5, _, name = line.strip().partition(" ")
        name = name.strip().lstrip("*")  # md5sum marks binary mode with '*'
        if len(md5) != 32 or any(c not in "0123456789abcdefABCDEF" for c in md5) or not name:
            raise PrepareError(f"{path}:{number}: expected '<32 hex digits>  <file name>', as md5sum writes it")
        if name not in by_name:
            raise PrepareError(f"{path}:{number}: {name!r} is none of this dataset's archives {sorted(by_name)}")
        by_name[name] = Archive(name, by_name[name].url, md5=md5.lower(), size=None)
    return tuple(by_name[a.name] for a in archives)


def _download(archive: Archive, url: str, download_dir: Path, opts: FetchOptions) -> None:
    """Download ``url`` into ``download_dir/<name>.part`` (resuming what is there) and rename it when whole."""
    download_dir.mkdir(parents=True, exist_ok=True)
    part = download_dir / f"{archive.name}.part"
    offset = part.stat().st_size if part.is_file() else 0
    if archive.size is not None and offset >= archive.size:  # whole already (or overlong: verify says so)
        os.replace(part, download_dir / archive.name)
        return
    request = urllib.request.Request(url, headers={"Range": f"bytes={offset}-"} if offset else {})
    try:
        response = urllib.request.urlopen(request, timeout=opts.connect_timeout)
    except urllib.error.HTTPError as err:
        if err.code == 416 and offset:  # nothing left past the part: it is whole
            os.replace(part, download_dir / archive.name)
            return
        raise PrepareError(
            f"{url}: HTTP {err.code} {err.reason}; download {archive.name} by hand into --archives DIR, or pass "
            "--mirror URL"
        ) from None
    except (urllib.error.URLError, OSError) as err:
        where = f"into {opts.archive_dir}" if opts.archive_dir else "into a folder and pass --archives DIR"
        raise PrepareError(f"cannot reach {url} ({getattr(err, 'reason', err)}): no network? Copy {archive.name} "
                           f"{where}, or pass --mirror URL") from None  # fmt: skip
    with response:
        if response.status == 206 and _range_start(response) != offset:
            raise PrepareError(f"{url}: asked for bytes from {offset:,}, the server sent others; delete {part} and "
                               "run again")  # fmt: skip
        offset = offset if response.status == 206 else 0  # 200: the server ignores Range, start over
        length = response.headers.get("Content-Length")
        total = offset + int(length) if length is not None else archive.size
        if total is not None:
            ensure_free_space(download_dir, total - offset, archive.name, opts)
        try:
            with open(part, "ab" if offset else "wb") as f, _bar(total, offset, archive.name, opts) as bar:
                while chunk := response.read(opts.chunk_bytes):
                    f.write(chunk)
                    bar.update(len(chunk))
        except OSError as err:
            if err.errno == errno.ENOSPC:
                raise PrepareError(f"{part}: the disk is full; free some space and run again (it resumes)") from None
            raise PrepareError(f"{url}: download of {archive.name} broke ({err}); run again to resume it") from None
        except http.client.HTTPException as err:
            raise PrepareError(f"{url}: download of {archive.name} broke ({err!r}); run again to resume it") from None
    got = part.stat().st_size
    if total is not None and got != total:
        raise PrepareError(f"{url}: download of {archive.name} stopped at {got:,} of {total:,} bytes; run again to "
                           "resume it")  # fmt: skip
    os.replace(part, download_dir / archive.name)


def _range_start(response) -> int | None:
    """First byte of a 206 answer's ``Content-Range: bytes START-END/TOTAL``."""
    value = response.headers.get("Content-Range", "")
    unit, _, span = value.partition(" ")
    start = span.partition("-")[0]
    return int(start) if unit == "bytes" and start.isdigit() else None


def ensure_free_space(folder: Path, needed: int, name: str, opts: FetchOptions) -> None:
    """Refuse up front when writing ``needed`` bytes into ``folder`` would leave under ``opts.min_free_bytes``."""
    free = shutil.disk_usage(folder).free
    if free - needed < opts.min_free_bytes:
        raise PrepareError(
            f"{folder}: {name} needs {needed / 2**30:.2f} GiB and {free / 2**30:.2f} GiB are free (keeping "
            f"{opts.min_free_bytes / 2**30:.2f} GiB spare); free some space or choose another ROOT"
        )


def _bar(total: int | None, initial: int, desc: str, opts: FetchOptions) -> tqdm:
    return tqdm(total=total, initial=initial, desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
                disable=not opts.progress, leave=False)  # fmt: skip
