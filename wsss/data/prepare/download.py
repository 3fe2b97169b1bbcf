"""Fetch a dataset archive and prove it intact: found in a folder the user has, or downloaded (resumed with HTTP
Range after an interruption), then checked against its published MD5 (or one from the user's ``--checksums``
file), or its size where none is published.

Every failure is one :class:`PrepareError` line naming the file and the fix: a bad checksum, a full disk, no
network, a server that is not one or that breaks the protocol, a stalled or cut download. A download grows in
``<name>.part`` beside its destination, each read written as it arrives (a kill keeps it, a re-run resumes from
it), and takes its final name only once verified, so a file with the archive's name is always a whole, checked one.

The bounds of a download: it never grows past the archive's known size (:class:`Archive`), nor past the point
where the disk would keep under ``FetchOptions.min_free_bytes`` free (checked before it starts and before each
write); each read waits at most ``FetchOptions.timeout`` seconds, and a transfer averaging under
``FetchOptions.min_bytes_per_s`` over a ``FetchOptions.rate_window_s`` window is given up.
"""

from __future__ import annotations

import errno
import hashlib
import http.client
import json
import os
import re
import shutil
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from wsss.utils.fileio import atomic_write_text

__all__ = [
    "MAX_TIMEOUT_S",
    "Archive",
    "FetchOptions",
    "PrepareError",
    "ensure_free_space",
    "fetch_archive",
    "file_md5",
    "mirror_problem",
    "read_checksums",
    "read_record",
    "room_problem",
]

MAX_TIMEOUT_S = 86_400.0
"""The longest ``FetchOptions.timeout`` (a day): a server silent longer is gone, and sockets refuse far longer ones."""


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
    """Size in bytes; checked when given (and always when there is no MD5); a download never grows past it."""
    md5_from: str | None = None
    """Where ``md5`` comes from when it is not the published one: the user's ``--checksums`` file."""


@dataclass(frozen=True)
class FetchOptions:
    """Where archives come from, how downloads behave and what disk space they leave."""

    archive_dir: Path | None = None
    """Folder of archives the user already has (looked in first, read in place, never written)."""
    mirror: str | None = None
    """Base URL serving the archives under their file names, used instead of each official address."""
    timeout: float = 10.0
    """Seconds an unanswered connection, and each read of a download, waits before it is given up."""
    min_bytes_per_s: int = 1024
    """Floor on a download's throughput: fewer bytes than this per second over a ``rate_window_s`` window, and the
    download is given up (what arrived is kept; a re-run resumes it)."""
    rate_window_s: float = 30.0
    """Seconds over which a download's throughput is measured against ``min_bytes_per_s``."""
    chunk_bytes: int = 1 << 20
    """Most bytes read from the network (and hashed) at a time."""
    min_free_bytes: int = 1 << 30
    """Space to leave free on the disk: a download or an extraction that would leave less is refused up front, and
    stopped where it would go below it (a stream of unknown length, a gzip bomb)."""
    progress: bool = True


def fetch_archive(archive: Archive, download_dir: Path, opts: FetchOptions, verified_dir: Path | None = None) -> Path:
    """The path of an intact copy of ``archive``: from ``opts.archive_dir``, else ``download_dir``, else downloaded.

    A copy already verified against the same MD5 (its size, modification time and that MD5 recorded in
    ``verified_dir``, by default ``download_dir/.verified``) is not hashed again; a damaged record is ignored.

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
    if read_record(record) == seen:
        return path
    verify(path, archive, fix, opts)
    atomic_write_text(record, json.dumps(seen) + "\n")
    return path


def read_record(path: Path) -> object:
    """The JSON value of one of this tool's records, or None when it is missing or damaged (not JSON, not UTF-8)."""
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return None


def source_url(archive: Archive, opts: FetchOptions) -> str:
    """``opts.mirror``/name when a mirror is given, else the official address."""
    return f"{opts.mirror.rstrip('/')}/{archive.name}" if opts.mirror else archive.url


def mirror_problem(url: str) -> str | None:
    """Why ``url`` cannot be a mirror's base address (``http://`` or ``https://``, a host), or None when it can."""
    if any(c.isspace() or not c.isprintable() for c in url):
        return "it holds a space or a control character (write a space as %20)"
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 (raises ValueError for a port that is not a number)
    except ValueError as err:
        return f"not a URL ({err})"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "not an http:// or https:// address with a host"
    return None


def verify(path: Path, archive: Archive, fix: str, opts: FetchOptions) -> None:
    """Check ``path`` against the archive's size and MD5; ``fix`` ends the error line."""
    if archive.md5_from:
        fix = f"{fix}, or correct {archive.md5_from}"
    else:
        fix = f"{fix}; or, to accept this copy (a mirror's, your lab's), give its MD5 with --checksums FILE"
    size = path.stat().st_size
    if archive.size is not None and size != archive.size:
        raise PrepareError(f"{path}: {size:,} bytes, but {archive.name} has {archive.size:,}; {fix}")
    if archive.md5 is not None:
        got = file_md5(path, opts)
        if got != archive.md5.lower():
            expected = f"{archive.md5}, the one {archive.md5_from} gives" if archive.md5_from else (
                f"the published {archive.md5}")  # fmt: skip
            raise PrepareError(f"{path}: MD5 {got} is not {expected} (corrupt or another file); {fix}")


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
        PrepareError: The file is not UTF-8 text, or a line is malformed or names no archive of the dataset (the
            message gives file:line).
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise PrepareError(f"{path}: not UTF-8 text (byte {err.start}); give an md5sum-format file, '<md5>  <name>' "
                           "per line") from None  # fmt: skip
    by_name = {a.name: a for a in archives}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        md5, _, name = line.strip().partition(" ")
        name = name.strip().lstrip("*")  # md5sum marks binary mode with '*'
        if len(md5) != 32 or any(c not in "0123456789abcdefABCDEF" for c in md5) or not name:
            raise PrepareError(f"{path}:{number}: expected '<32 hex digits>  <file name>', as md5sum writes it")
        if name not in by_name:
            raise PrepareError(f"{path}:{number}: {name!r} is none of this dataset's archives {sorted(by_name)}")
        by_name[name] = Archive(name, by_name[name].url, md5=md5.lower(), md5_from=str(path))
    return tuple(by_name[a.name] for a in archives)


def _download(archive: Archive, url: str, download_dir: Path, opts: FetchOptions) -> None:
    """Download ``url`` into ``download_dir/<name>.part`` (resuming what is there) and rename it when whole."""
    download_dir.mkdir(parents=True, exist_ok=True)
    part = download_dir / f"{archive.name}.part"
    offset = part.stat().st_size if part.is_file() else 0
    response = None
    if archive.size is None or offset < archive.size:  # else whole already (or overlong: verify says so)
        response = _open(archive, url, offset, opts)
    if response is None:  # nothing left to fetch
        os.replace(part, download_dir / archive.name)
        return
    with response:
        offset = _resume_offset(response, offset, url, part)
        total = _total(response, offset, archive, url, opts)
        if total is not None:
            ensure_free_space(download_dir, total - offset, archive.name, opts)
        try:
            got = _receive(response, part, offset, total, url, opts)
        except TimeoutError:
            raise PrepareError(f"{url}: no data for {opts.timeout:g} s at {part.stat().st_size:,} bytes of "
                               f"{archive.name}; run again to resume it (--timeout SECONDS waits longer)"
                               ) from None  # fmt: skip
        except OSError as err:
            if err.errno == errno.ENOSPC:
                raise PrepareError(f"{part}: the disk is full; free some space and run again (it resumes)") from None
            raise PrepareError(f"{url}: download of {archive.name} broke ({err}); run again to resume it") from None
        except http.client.HTTPException as err:
            raise PrepareError(f"{url}: download of {archive.name} broke ({err!r}); run again to resume it") from None
    if total is not None and got != total:
        raise PrepareError(f"{url}: download of {archive.name} stopped at {got:,} of {total:,} bytes; run again to "
                           "resume it")  # fmt: skip
    os.replace(part, download_dir / archive.name)


def _open(archive: Archive, url: str, offset: int, opts: FetchOptions) -> http.client.HTTPResponse | None:
    """The answer to a GET of ``url`` from byte ``offset`` on; None when the server has nothing past it (416)."""
    try:
        request = urllib.request.Request(url, headers={"Range": f"bytes={offset}-"} if offset else {})
        return urllib.request.urlopen(request, timeout=opts.timeout)
    except urllib.error.HTTPError as err:
        if err.code == 416 and offset:  # nothing left past the part: it is whole
            return None
        reason = " ".join(str(err.reason).split())  # a redirect loop's reason spans lines
        raise PrepareError(f"{url}: HTTP {err.code} {reason}; {_elsewhere(archive, opts)}") from None
    except (urllib.error.URLError, OSError) as err:
        raise PrepareError(f"cannot reach {url} ({getattr(err, 'reason', err)}): no network? "
                           f"{_elsewhere(archive, opts)}") from None  # fmt: skip
    except (ValueError, http.client.InvalidURL) as err:  # a mirror's address, or where a server redirects to
        raise PrepareError(f"{url}: not a valid address ({err}); {_elsewhere(archive, opts)}") from None
    except http.client.HTTPException as err:
        raise PrepareError(f"{url}: the answer is not HTTP ({_brief(err)}), is it a web server? "
                           f"{_elsewhere(archive, opts)}") from None  # fmt: skip


def _elsewhere(archive: Archive, opts: FetchOptions) -> str:
    """Where else ``archive`` can come from: the user's folder, or a mirror (the one given, to check)."""
    where = f"into {opts.archive_dir}" if opts.archive_dir else "into a folder and pass --archives DIR"
    mirror = f"or check --mirror {opts.mirror}" if opts.mirror else "or pass --mirror URL"
    return f"copy {archive.name} {where}, {mirror}"


def _brief(err: Exception, limit: int = 80) -> str:
    text = repr(err)
    return text if len(text) <= limit else f"{text[:limit]}..."


def _resume_offset(response: http.client.HTTPResponse, offset: int, url: str, part: Path) -> int:
    """Where the body starts in the archive: ``offset`` for a 206 that starts there, 0 for a 200 (no Range)."""
    if response.status != 206:
        return 0  # the server ignores Range: start over
    value = response.headers.get("Content-Range", "")
    unit, _, span = value.partition(" ")
    start = span.partition("-")[0]
    if unit != "bytes" or not start.isdecimal() or int(start) != offset:
        raise PrepareError(f"{url}: asked for bytes from {offset:,}, the server sent others (Content-Range "
                           f"{value!r}); delete {part} and run again")  # fmt: skip
    return offset


def _total(
    response: http.client.HTTPResponse, offset: int, archive: Archive, url: str, opts: FetchOptions
) -> int | None:
    """The size the part will have: the archive's known size, else ``offset`` + Content-Length, else None.

    Raises:
        PrepareError: The Content-Length is not one byte count, or it disagrees with the archive's known size.
    """
    value = response.headers.get("Content-Length")
    if value is not None and not re.fullmatch(r"\s*[0-9]+\s*", value):
        raise PrepareError(f"{url}: Content-Length {value!r} is not a byte count, the server is broken; "
                           f"{_elsewhere(archive, opts)}")  # fmt: skip
    offered = None if value is None else offset + int(value)
    if archive.size is not None and offered not in (None, archive.size):
        raise PrepareError(f"{url}: the server offers {offered:,} bytes, but {archive.name} has {archive.size:,}; "
                           f"{_elsewhere(archive, opts)}")  # fmt: skip
    return offered if archive.size is None else archive.size


def _receive(
    response: http.client.HTTPResponse, part: Path, offset: int, total: int | None, url: str, opts: FetchOptions
) -> int:
    """Append the body to ``part`` as it arrives, up to ``total`` bytes in all; returns the part's size.

    Each read returns what has come (at most ``opts.chunk_bytes``) and is flushed at once: a kill keeps it, and the
    bar moves. A read waits at most ``opts.timeout`` seconds (the socket's timeout raises TimeoutError).

    Raises:
        PrepareError: The next bytes would leave under ``opts.min_free_bytes`` free, or the transfer averaged under
            ``opts.min_bytes_per_s`` over the last ``opts.rate_window_s`` seconds.
    """
    got, since, at = offset, time.monotonic(), offset
    with open(part, "ab" if offset else "wb") as f, _bar(total, offset, part.stem, opts) as bar:
        while total is None or got < total:
            chunk = response.read1(opts.chunk_bytes if total is None else min(opts.chunk_bytes, total - got))
            if not chunk:
                break
            if why := room_problem(part.parent, len(chunk), opts):
                raise PrepareError(f"{part}: stopped at {got:,} bytes, {why}; {_room_fix(part, total)}")
            f.write(chunk)
            f.flush()
            got += len(chunk)
            bar.update(len(chunk))
            if (now := time.monotonic()) - since >= opts.rate_window_s:
                if got - at < opts.min_bytes_per_s * (now - since):
                    raise PrepareError(f"{url}: {got - at:,} bytes in {now - since:.1f} s, under the floor of "
                                       f"{opts.min_bytes_per_s:,} bytes/s; run again to resume it, or use a faster "
                                       "source (--mirror URL, --archives DIR)")  # fmt: skip
                since, at = now, got
    return got


def _room_fix(part: Path, total: int | None) -> str:
    fix = "free some space and run again (it resumes)"
    if total is None:  # a stream without a length may have no end
        return f"the server gave no length and the archive has no known size: delete {part} if it never ends, or {fix}"
    return fix


def room_problem(folder: Path, needed: int, opts: FetchOptions) -> str | None:
    """None when ``needed`` more bytes fit in ``folder`` with ``opts.min_free_bytes`` to spare, else how much is free
    (``X GiB are free (keeping Y GiB spare)``)."""
    free = shutil.disk_usage(folder).free
    if free - needed >= opts.min_free_bytes:
        return None
    return f"{free / 2**30:.2f} GiB are free (keeping {opts.min_free_bytes / 2**30:.2f} GiB spare)"


def ensure_free_space(folder: Path, needed: int, name: str, opts: FetchOptions) -> None:
    """Refuse up front when writing ``needed`` bytes into ``folder`` would leave under ``opts.min_free_bytes``."""
    if why := room_problem(folder, needed, opts):
        raise PrepareError(f"{folder}: {name} needs {needed / 2**30:.2f} GiB and {why}; free some space or choose "
                           "another ROOT")  # fmt: skip


def _bar(total: int | None, initial: int, desc: str, opts: FetchOptions) -> tqdm:
    return tqdm(total=total, initial=initial, desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
                disable=not opts.progress, leave=False)  # fmt: skip
