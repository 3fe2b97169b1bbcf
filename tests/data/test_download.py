"""Fetching an archive from a local HTTP server: resume with Range, checksums, the disk and time bounds of a download
(a stream without end, a trickle, a silent server), and one-line errors for hostile servers."""

from __future__ import annotations

import errno
import io
import json
import re
import socket
import threading
import time
from dataclasses import replace

import pytest

from tests.data.archive_server import ArchiveServer, limit_disk, make_voc_archives
from wsss.data.prepare import download
from wsss.data.prepare.download import FetchOptions, PrepareError, fetch_archive, mirror_problem, read_checksums

OPTS = FetchOptions(progress=False, min_free_bytes=0)


@pytest.fixture
def served(tmp_path):
    """(the server, the VOC tar's Archive record, its bytes)."""
    folder = tmp_path / "served"
    folder.mkdir()
    tar = make_voc_archives(folder)[0]
    with ArchiveServer(folder) as server:
        yield server, tar, (folder / tar.name).read_bytes()


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_cut_download_resumes_with_range(served, tmp_path):
    server, tar, data = served
    server.cut[tar.name] = 1000
    downloads = tmp_path / "downloads"
    with pytest.raises(PrepareError, match=rf"stopped at 1,000 of {len(data):,} bytes; run again to resume") as err:
        fetch_archive(tar, downloads, replace(OPTS, mirror=server.url))
    assert "\n" not in str(err.value)
    assert (downloads / f"{tar.name}.part").stat().st_size == 1000 and not (downloads / tar.name).exists()

    path = fetch_archive(tar, downloads, replace(OPTS, mirror=server.url))
    assert server.requests == [(tar.name, None), (tar.name, "bytes=1000-")]
    assert path == downloads / tar.name and path.read_bytes() == data
    assert not (downloads / f"{tar.name}.part").exists()


def test_server_ignoring_range_restarts_from_zero(served, tmp_path):
    server, tar, data = served
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    (downloads / f"{tar.name}.part").write_bytes(b"x" * 100)  # bytes this server will not continue
    server.ranges = False
    path = fetch_archive(tar, downloads, replace(OPTS, mirror=server.url))
    assert server.requests == [(tar.name, "bytes=100-")] and path.read_bytes() == data


def test_corrupt_download_refused_in_one_line(served, tmp_path):
    server, tar, data = served
    (server.folder / tar.name).write_bytes(data[:500] + bytes([data[500] ^ 1]) + data[501:])
    downloads = tmp_path / "downloads"
    with pytest.raises(PrepareError) as err:
        fetch_archive(tar, downloads, replace(OPTS, mirror=server.url))
    message = str(err.value)
    assert message.startswith(f"{downloads / tar.name}: MD5 ") and f"is not the published {tar.md5}" in message
    assert message.endswith("delete it and run again to download it afresh; or, to accept this copy (a mirror's, "
                            "your lab's), give its MD5 with --checksums FILE") and "\n" not in message  # fmt: skip


def test_md5_from_a_checksums_file_is_named_as_such(served, tmp_path):
    server, tar, data = served
    sums = tmp_path / "MD5SUMS"
    sums.write_text(f"{'0' * 32}  {tar.name}\n")
    mine = read_checksums(sums, (tar,))[0]
    with pytest.raises(PrepareError) as err:
        fetch_archive(mine, tmp_path / "downloads", replace(OPTS, mirror=server.url))
    message = str(err.value)
    assert f"is not {'0' * 32}, the one {sums} gives (corrupt or another file)" in message
    assert "published" not in message and message.endswith(f"download it afresh, or correct {sums}")


def test_archive_dir_copy_is_checked_in_place(served, tmp_path):
    server, tar, data = served
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / tar.name).write_bytes(data)
    assert fetch_archive(tar, tmp_path / "downloads", replace(OPTS, archive_dir=mine)) == mine / tar.name
    assert server.requests == [] and not (tmp_path / "downloads" / tar.name).exists()
    (mine / tar.name).write_bytes(data[:-1] + b"!")
    with pytest.raises(PrepareError, match=rf"^{mine / tar.name}: MD5 .* replace it with an intact copy from "):
        fetch_archive(tar, tmp_path / "downloads", replace(OPTS, archive_dir=mine))


def test_size_checked_where_no_md5_is_published(served, tmp_path):
    server, tar, data = served
    unsummed = replace(tar, md5=None, size=len(data) + 1)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / tar.name).write_bytes(data)
    with pytest.raises(PrepareError, match=rf"{len(data):,} bytes, but {tar.name} has {len(data) + 1:,}"):
        fetch_archive(unsummed, tmp_path / "downloads", replace(OPTS, archive_dir=mine))
    assert fetch_archive(replace(unsummed, size=len(data)), tmp_path / "d", replace(OPTS, archive_dir=mine))


def test_no_network_in_one_line(tmp_path):
    tar = make_voc_archives(tmp_path)[0]
    url = closed_port_url()
    with pytest.raises(PrepareError) as err:
        fetch_archive(tar, tmp_path / "downloads", replace(OPTS, mirror=url, archive_dir=tmp_path / "mine"))
    assert str(err.value).startswith(f"cannot reach {url}/{tar.name} (")
    assert str(err.value).endswith(f"copy {tar.name} into {tmp_path / 'mine'}, or check --mirror {url}")
    with pytest.raises(PrepareError, match=rf"copy {tar.name} into a folder and pass --archives DIR, or pass --mirror "
                                           "URL$"):  # fmt: skip
        fetch_archive(replace(tar, url=f"{url}/{tar.name}"), tmp_path / "downloads", OPTS)


def test_full_disk_refused_before_downloading(served, tmp_path):
    server, tar, data = served
    downloads = tmp_path / "downloads"
    with pytest.raises(PrepareError, match=rf"^{downloads}: {tar.name} needs 0.00 GiB and .* GiB are free .* free "
                                           "some space or choose another ROOT$"):  # fmt: skip
        fetch_archive(tar, downloads, replace(OPTS, mirror=server.url, min_free_bytes=1 << 62))
    assert list(downloads.iterdir()) == []  # nothing written


def test_http_error_names_the_address(served, tmp_path):
    server, tar, _ = served
    with pytest.raises(PrepareError, match=rf"^{server.url}/other.tar: HTTP 404 .* --archives DIR, or check --mirror "
                                           rf"{server.url}$"):  # fmt: skip
        fetch_archive(replace(tar, name="other.tar"), tmp_path / "downloads", replace(OPTS, mirror=server.url))


def test_checksums_file_replaces_md5s(tmp_path):
    archives = tuple(make_voc_archives(tmp_path))
    sums = tmp_path / "MD5SUMS"
    sums.write_text(f"# mine\n{'A' * 32} *{archives[1].name}\n\n")
    out = read_checksums(sums, archives)
    assert out[0] == archives[0] and out[1].md5 == "a" * 32 and out[1].url == archives[1].url
    sums.write_text(f"{'a' * 32}  {archives[0].name}\n{'a' * 31}  {archives[1].name}\n")
    with pytest.raises(PrepareError, match=rf"^{sums}:2: expected '<32 hex digits>  <file name>'"):
        read_checksums(sums, archives)
    sums.write_text(f"{'a' * 32}  train2014.zip\n")
    with pytest.raises(PrepareError, match=rf"^{sums}:1: 'train2014.zip' is none of this dataset's archives"):
        read_checksums(sums, archives)


def test_disk_full_while_downloading_in_one_line(served, tmp_path, monkeypatch):
    server, tar, _ = served

    class FullDisk(io.BytesIO):
        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(download, "open", lambda *a, **k: FullDisk(), raising=False)  # the disk fills mid-way
    part = tmp_path / "downloads" / f"{tar.name}.part"
    with pytest.raises(PrepareError, match=rf"^{part}: the disk is full; free some space and run again \(it resumes"):
        fetch_archive(tar, tmp_path / "downloads", replace(OPTS, mirror=server.url))


def trickle(delay: float, limit: int):
    """A sender writing one byte every ``delay`` seconds, ``limit`` bytes at most."""

    def send(wfile, body: bytes) -> None:
        for byte in body[:limit]:
            wfile.write(bytes([byte]))
            time.sleep(delay)

    return send


def then_junk(size: int):
    """A sender writing the body, then ``size`` bytes more (a stream that goes on past the archive)."""

    def send(wfile, body: bytes) -> None:
        wfile.write(body)
        for _ in range(size >> 16):
            wfile.write(bytes(1 << 16))

    return send


def test_stream_without_length_stops_at_the_archives_known_size(served, tmp_path):
    server, tar, data = served
    server.headers[tar.name] = {"Content-Length": None}
    server.send[tar.name] = then_junk(16 << 20)
    path = fetch_archive(replace(tar, size=len(data)), tmp_path / "downloads", replace(OPTS, mirror=server.url))
    assert path.read_bytes() == data


def test_stream_without_length_or_known_size_stops_at_the_free_space_margin(served, tmp_path, monkeypatch):
    server, tar, data = served
    server.headers[tar.name] = {"Content-Length": None}
    server.send[tar.name] = then_junk(16 << 20)
    downloads = tmp_path / "downloads"
    limit_disk(monkeypatch, tmp_path, free=4 << 20)
    part = downloads / f"{tar.name}.part"
    with pytest.raises(PrepareError) as err:
        fetch_archive(tar, downloads, replace(OPTS, mirror=server.url, min_free_bytes=1 << 20))
    message = str(err.value)
    assert message.startswith(f"{part}: stopped at ") and "GiB are free (keeping 0.00 GiB spare)" in message
    assert message.endswith(f"the server gave no length and the archive has no known size: delete {part} if it "
                            "never ends, or free some space and run again (it resumes)")  # fmt: skip
    assert 2 << 20 < part.stat().st_size <= 3 << 20  # the 1 MiB margin kept


def test_free_space_counts_the_bytes_still_to_come(served, tmp_path, monkeypatch):
    server, tar, data = served
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    limit_disk(monkeypatch, tmp_path, free=len(data) - 1)  # one byte short
    with pytest.raises(PrepareError, match=rf"^{downloads}: {tar.name} needs 0.00 GiB and 0.00 GiB are free"):
        fetch_archive(tar, downloads, replace(OPTS, mirror=server.url))
    assert list(downloads.iterdir()) == []  # refused before a byte was written


def test_trickle_is_given_up_under_the_throughput_floor(served, tmp_path):
    server, tar, _ = served
    server.send[tar.name] = trickle(0.05, limit=80)  # 20 bytes/s for 4 s
    part = tmp_path / "downloads" / f"{tar.name}.part"
    opts = replace(OPTS, mirror=server.url, min_bytes_per_s=1000, rate_window_s=0.5)
    floor = r"\d+ bytes in \d\.\d s, under the floor of 1,000 bytes/s; run again to resume it, or use a faster source"
    with pytest.raises(PrepareError, match=rf"^{server.url}/{tar.name}: {floor}"):
        fetch_archive(tar, tmp_path / "downloads", opts)
    assert 0 < part.stat().st_size < 80  # written as it came, given up before the end


def test_a_read_waits_at_most_the_timeout_and_keeps_what_came(served, tmp_path):
    server, tar, _ = served

    def stall(wfile, body: bytes) -> None:
        wfile.write(body[:100])
        time.sleep(5)

    server.send[tar.name] = stall
    part = tmp_path / "downloads" / f"{tar.name}.part"
    with pytest.raises(PrepareError, match=rf"^{server.url}/{tar.name}: no data for 1 s at 100 bytes of {tar.name}; "
                                           r"run again to resume it \(--timeout SECONDS waits longer\)$"):  # fmt: skip
        fetch_archive(tar, tmp_path / "downloads", replace(OPTS, mirror=server.url, timeout=1.0))
    assert part.stat().st_size == 100


@pytest.mark.parametrize("length", ["abc", "5, 5", "-5", "1e3"])
def test_content_length_not_a_byte_count_refused_in_one_line(served, tmp_path, length):
    server, tar, _ = served
    server.headers[tar.name] = {"Content-Length": length}
    downloads = tmp_path / "downloads"
    with pytest.raises(PrepareError, match=rf"^{server.url}/{tar.name}: Content-Length '{length}' is not a byte count"):
        fetch_archive(tar, downloads, replace(OPTS, mirror=server.url))
    assert list(downloads.iterdir()) == []


def test_content_length_other_than_the_known_size_refused(served, tmp_path):
    server, tar, data = served
    downloads = tmp_path / "downloads"
    with pytest.raises(PrepareError, match=rf"the server offers {len(data):,} bytes, but {tar.name} has "
                                           f"{len(data) + 1:,}; copy "):  # fmt: skip
        fetch_archive(replace(tar, size=len(data) + 1), downloads, replace(OPTS, mirror=server.url))
    assert list(downloads.iterdir()) == []


def test_resume_refuses_an_answer_that_starts_elsewhere(served, tmp_path):
    server, tar, data = served
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    part = downloads / f"{tar.name}.part"
    part.write_bytes(data[:1000])
    server.restart = True  # a 206 from byte 0 whatever was asked
    span = f"bytes 0-{len(data) - 1}/{len(data)}"
    with pytest.raises(PrepareError, match=rf"asked for bytes from 1,000, the server sent others \(Content-Range "
                                           rf"'{span}'\); delete {part} and run again"):  # fmt: skip
        fetch_archive(tar, downloads, replace(OPTS, mirror=server.url))
    assert part.read_bytes() == data[:1000]  # nothing appended


def test_a_new_md5_is_checked_against_a_copy_verified_before(served, tmp_path):
    server, tar, _ = served
    downloads = tmp_path / "downloads"
    fetch_archive(tar, downloads, replace(OPTS, mirror=server.url))  # verified and recorded
    with pytest.raises(PrepareError, match=f"is not the published {'0' * 32}"):
        fetch_archive(replace(tar, md5="0" * 32), downloads, replace(OPTS, mirror=server.url))


@pytest.mark.parametrize("damage", [b'{"path": ', b"[1, 2]", b"\xff\xfe", b"[" * 100_000, b'{"size": "x"}'])
def test_damaged_verified_record_is_ignored_and_the_copy_hashed_again(served, tmp_path, monkeypatch, damage):
    server, tar, _ = served
    downloads = tmp_path / "downloads"
    fetch_archive(tar, downloads, replace(OPTS, mirror=server.url))
    record = downloads / ".verified" / f"{tar.name}.json"
    record.write_bytes(damage)
    hashed = []
    monkeypatch.setattr(download, "file_md5", lambda path, opts: hashed.append(path) or tar.md5)
    assert fetch_archive(tar, downloads, replace(OPTS, mirror=server.url)) == downloads / tar.name
    assert hashed == [downloads / tar.name] and json.loads(record.read_text())["md5"] == tar.md5


def test_redirect_loop_in_one_line(served, tmp_path):
    server, tar, _ = served
    server.redirect[tar.name] = f"/{tar.name}"
    with pytest.raises(PrepareError, match=rf"^{server.url}/{tar.name}: HTTP 302 .*infinite loop.*; copy ") as err:
        fetch_archive(tar, tmp_path / "downloads", replace(OPTS, mirror=server.url))
    assert "\n" not in str(err.value)


def test_an_answer_that_is_not_http_in_one_line(tmp_path):
    tar = make_voc_archives(tmp_path)[0]
    with socket.socket() as listener:  # an SSH server's greeting, as at a mirror given an SSH port
        listener.bind(("127.0.0.1", 0))
        listener.listen()

        def greet() -> None:
            connection, _ = listener.accept()
            with connection:
                connection.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")

        threading.Thread(target=greet, daemon=True).start()
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        with pytest.raises(PrepareError) as err:
            fetch_archive(tar, tmp_path / "downloads", replace(OPTS, mirror=url))
    assert str(err.value).startswith(f"{url}/{tar.name}: the answer is not HTTP (BadStatusLine(")
    assert str(err.value).endswith(f"is it a web server? copy {tar.name} into a folder and pass --archives DIR, or "
                                   f"check --mirror {url}") and "\n" not in str(err.value)  # fmt: skip


@pytest.mark.parametrize(("mirror", "says"), [("http://[::1/x", "not a URL (Invalid IPv6 URL)"),
                                              ("http://host/my archives", "it holds a space"),
                                              ("http://host:port/x", "not a URL (Port could not be cast"),
                                              ("ftp://host/x", "not an http:// or https:// address"),
                                              ("/srv/voc", "not an http:// or https:// address")])  # fmt: skip
def test_mirror_problem(mirror, says):
    assert mirror_problem(mirror).startswith(says)
    assert mirror_problem("https://host:8443/my%20archives/") is None


def test_invalid_address_in_one_line(tmp_path):
    tar = make_voc_archives(tmp_path)[0]
    for mirror in ("http://[::1/x", "http://127.0.0.1:9/my archives"):  # as a redirect could give them
        with pytest.raises(PrepareError, match=rf"^{re.escape(mirror)}/{tar.name}: not a valid address \(.*\); copy "):
            fetch_archive(tar, tmp_path / "downloads", replace(OPTS, mirror=mirror))


def test_checksums_file_not_utf8_refused_in_one_line(tmp_path):
    archives = tuple(make_voc_archives(tmp_path))
    sums = tmp_path / "MD5SUMS"
    sums.write_bytes(f"{'a' * 32}  {archives[0].name}\n".encode() + b"\xff\n")
    with pytest.raises(PrepareError, match=rf"^{sums}: not UTF-8 text \(byte 62\); give an md5sum-format file"):
        read_checksums(sums, archives)
