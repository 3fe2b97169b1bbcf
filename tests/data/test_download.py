"""Fetching an archive from a local HTTP server: resume with Range, checksums, and one-line errors."""

from __future__ import annotations

import errno
import io
import socket
from dataclasses import replace

import pytest

from tests.data.archive_server import ArchiveServer, make_voc_archives
from wsss.data import download
from wsss.data.download import FetchOptions, PrepareError, fetch_archive, read_checksums

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
    assert message.endswith("delete it and run again to download it afresh") and "\n" not in message


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
    assert f"Copy {tar.name} into {tmp_path / 'mine'}, or pass --mirror URL" in str(err.value)


def test_full_disk_refused_before_downloading(served, tmp_path):
    server, tar, data = served
    downloads = tmp_path / "downloads"
    with pytest.raises(PrepareError, match=rf"^{downloads}: {tar.name} needs 0.00 GiB and .* GiB are free .* free "
                                           "some space or choose another ROOT$"):  # fmt: skip
        fetch_archive(tar, downloads, replace(OPTS, mirror=server.url, min_free_bytes=1 << 62))
    assert list(downloads.iterdir()) == []  # nothing written


def test_http_error_names_the_address(served, tmp_path):
    server, tar, _ = served
    with pytest.raises(PrepareError, match=rf"^{server.url}/other.tar: HTTP 404 .* --archives DIR, or pass --mirror"):
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
