"""Safe, all-or-nothing extraction: members that could escape the root are refused; nothing half-done looks done."""

from __future__ import annotations

import errno
import io
import os
import re
import stat
import tarfile
import zipfile
from dataclasses import replace

import pytest

from tests.data.archive_server import limit_disk
from wsss.data.prepare.download import FetchOptions, PrepareError
from wsss.data.prepare.extract import extract_archive

OPTS = FetchOptions(progress=False, min_free_bytes=0)


def add_file(tar: tarfile.TarFile, name: str, data: bytes = b"data") -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def add_link(tar: tarfile.TarFile, name: str, target: str, kind: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    tar.addfile(info)


@pytest.mark.parametrize(
    ("member", "why"),
    [("../evil.txt", "a '..' part"), ("top/../../evil.txt", "a '..' part"), ("/tmp/evil.txt", "an absolute path"),
     ("..\\evil.txt", "a '..' part"), ("top\\..\\..\\evil.txt", "a '..' part"),
     ("top/link", "a link"), ("top/hard", "a link"), ("top/fifo", "a device or pipe")],
)  # fmt: skip
def test_unsafe_tar_member_refused_and_nothing_left(tmp_path, member, why):
    archive = tmp_path / "x.tgz"
    with tarfile.open(archive, "w:gz") as tar:
        add_file(tar, "top/good.txt")  # unpacked before the bad member is met
        if member == "top/link":
            add_link(tar, member, "/etc/passwd", tarfile.SYMTYPE)
        elif member == "top/hard":
            add_link(tar, member, "../../outside", tarfile.LNKTYPE)
        elif member == "top/fifo":
            info = tarfile.TarInfo(member)
            info.type = tarfile.FIFOTYPE
            tar.addfile(info)
        else:
            add_file(tar, member)
    dest = tmp_path / "dest"
    named = re.escape(repr(member))
    with pytest.raises(PrepareError, match=rf"^{archive}: member {named} is {why}, .* delete it and download"):
        extract_archive(archive, dest, OPTS)
    assert list(dest.iterdir()) == []  # no top/ with good.txt, no partial folder
    assert not (tmp_path / "evil.txt").exists()


@pytest.mark.parametrize(("member", "why"), [("../evil.txt", "a '..' part"), ("/abs.txt", "an absolute path"),
                                             ("..\\evil.txt", "a '..' part"), ("C:/win.txt", "an absolute path"),
                                             ("top/link", "a link")])  # fmt: skip
def test_unsafe_zip_member_refused(tmp_path, member, why):
    archive = tmp_path / "x.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("top/good.txt", "data")
        info = zipfile.ZipInfo(member)
        if member == "top/link":
            info.external_attr = 0o120777 << 16  # a symbolic link, as zip -y stores it
        zf.writestr(info, "/etc/passwd")
    dest = tmp_path / "dest"
    with pytest.raises(PrepareError, match=rf"member {re.escape(repr(member))} is {why}"):
        extract_archive(archive, dest, OPTS)
    assert list(dest.iterdir()) == []


def test_extraction_moves_top_level_into_place_and_clears_a_killed_runs_partial(tmp_path):
    archive = tmp_path / "a.tar"
    with tarfile.open(archive, "w") as tar:
        add_file(tar, "VOCdevkit/VOC2012/x.txt", b"hello")
        add_file(tar, "other.txt", b"!")
    dest = tmp_path / "dest"
    (dest / ".a.tar.partial" / "VOCdevkit").mkdir(parents=True)  # what a killed run left
    (dest / ".a.tar.partial" / "VOCdevkit" / "stale.txt").write_text("stale")
    assert extract_archive(archive, dest, OPTS) == ["VOCdevkit", "other.txt"]
    assert sorted(p.name for p in dest.iterdir()) == ["VOCdevkit", "other.txt"]
    assert (dest / "VOCdevkit" / "VOC2012" / "x.txt").read_bytes() == b"hello"
    assert not (dest / "VOCdevkit" / "stale.txt").exists()


def test_existing_folder_is_not_overwritten(tmp_path):
    archive = tmp_path / "a.tar"
    with tarfile.open(archive, "w") as tar:
        add_file(tar, "VOCdevkit/x.txt")
    (tmp_path / "dest" / "VOCdevkit").mkdir(parents=True)
    (tmp_path / "dest" / "VOCdevkit" / "mine.txt").write_text("mine")
    with pytest.raises(PrepareError, match=r"dest/VOCdevkit exists but was not unpacked by this tool from a.tar; move"):
        extract_archive(archive, tmp_path / "dest", OPTS)
    assert [p.name for p in (tmp_path / "dest" / "VOCdevkit").iterdir()] == ["mine.txt"]


def test_truncated_archive_is_corrupt(tmp_path):
    archive = tmp_path / "a.tgz"
    with tarfile.open(archive, "w:gz") as tar:
        add_file(tar, "top/x.bin", bytes(range(256)) * 400)
    archive.write_bytes(archive.read_bytes()[:-200])
    with pytest.raises(PrepareError, match=rf"^{archive}: corrupt archive \(.*\); delete it and run again$"):
        extract_archive(archive, tmp_path / "dest", OPTS)
    assert list((tmp_path / "dest").iterdir()) == []


def test_full_disk_refused_before_unpacking(tmp_path):
    archive = tmp_path / "a.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("top/x.txt", "x" * 1000)
    with pytest.raises(PrepareError, match=r"a.zip needs 0.00 GiB and .* free some space or choose another ROOT"):
        extract_archive(archive, tmp_path / "dest", replace(OPTS, min_free_bytes=1 << 62))
    assert list((tmp_path / "dest").iterdir()) == []


def test_disk_full_while_unpacking_in_one_line(tmp_path, monkeypatch):
    archive = tmp_path / "a.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("top/x.txt", "x")

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(zipfile.ZipFile, "extract", full)  # the disk fills mid-way
    with pytest.raises(PrepareError, match=r"dest: the disk is full while unpacking a.zip; free some space and run"):
        extract_archive(archive, tmp_path / "dest", OPTS)
    assert list((tmp_path / "dest").iterdir()) == []


def test_tar_modes_are_made_safe(tmp_path):
    archive = tmp_path / "a.tar"
    with tarfile.open(archive, "w") as tar:
        info = tarfile.TarInfo("top/run.sh")
        info.size, info.mode = 4, 0o6777  # setuid, setgid, writable by anyone
        tar.addfile(info, io.BytesIO(b"data"))
    extract_archive(archive, tmp_path / "dest", OPTS)
    mode = os.stat(tmp_path / "dest" / "top" / "run.sh").st_mode
    assert not mode & (stat.S_ISUID | stat.S_ISGID | stat.S_IWGRP | stat.S_IWOTH), oct(mode)


def test_tar_refused_before_unpacking_when_its_size_does_not_fit(tmp_path, monkeypatch):
    archive = tmp_path / "a.tar"
    with tarfile.open(archive, "w") as tar:
        add_file(tar, "top/x.bin", bytes(50_000))
    limit_disk(monkeypatch, tmp_path, free=archive.stat().st_size - 1)  # the members fit, the archive does not
    unpacked = []
    monkeypatch.setattr(tarfile.TarFile, "extract", lambda tar, member, *a, **k: unpacked.append(member))
    with pytest.raises(PrepareError, match=r"dest/.a.tar.partial: a.tar needs 0.00 GiB and 0.00 GiB are free"):
        extract_archive(archive, tmp_path / "dest", OPTS)
    assert unpacked == [] and list((tmp_path / "dest").iterdir()) == []


def test_gzip_bomb_stops_before_the_member_that_would_fill_the_disk(tmp_path, monkeypatch):
    archive = tmp_path / "bomb.tgz"
    with tarfile.open(archive, "w:gz") as tar:
        add_file(tar, "top/small.txt", b"x" * 1000)
        add_file(tar, "top/zeros.bin", bytes(32 << 20))  # 32 MiB of zeros, about 32 KiB compressed
    assert archive.stat().st_size < 1 << 20
    dest = tmp_path / "dest"
    limit_disk(monkeypatch, tmp_path, free=8 << 20)
    with pytest.raises(PrepareError, match=rf"^{dest}: unpacking bomb.tgz stopped before member 'top/zeros.bin' "
                                           r"\(33,554,432 bytes\), 0.01 GiB are free \(keeping 0.00 GiB spare\); free "
                                           "some space or choose another ROOT$"):  # fmt: skip
        extract_archive(archive, dest, replace(OPTS, min_free_bytes=1 << 20))
    assert list(dest.iterdir()) == []


def test_disk_filled_by_another_writer_stops_the_next_member(tmp_path, monkeypatch):
    archive = tmp_path / "a.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("top/a.txt", "a" * 1000)
        zf.writestr("top/b.txt", "b" * 1000)
    limit_disk(monkeypatch, tmp_path, free=1 << 20)
    extract = zipfile.ZipFile.extract

    def and_another_writer(zf, info, path):
        extract(zf, info, path)
        (tmp_path / "other.bin").write_bytes(bytes(1 << 20))  # someone else fills the disk meanwhile

    monkeypatch.setattr(zipfile.ZipFile, "extract", and_another_writer)
    with pytest.raises(PrepareError, match=r"unpacking a.zip stopped before member 'top/b.txt' \(1,000 bytes\)"):
        extract_archive(archive, tmp_path / "dest", OPTS)
    assert list((tmp_path / "dest").iterdir()) == []


def test_a_clash_moves_nothing_into_place(tmp_path):
    archive = tmp_path / "a.tar"
    with tarfile.open(archive, "w") as tar:
        add_file(tar, "VOCdevkit/x.txt")
        add_file(tar, "benchmark_RELEASE/y.txt")
    dest = tmp_path / "dest"
    (dest / "benchmark_RELEASE").mkdir(parents=True)  # the second top-level name in sorted order
    with pytest.raises(PrepareError, match=rf"{dest / 'benchmark_RELEASE'} exists but was not unpacked"):
        extract_archive(archive, dest, OPTS)
    assert sorted(p.name for p in dest.iterdir()) == ["benchmark_RELEASE"]
