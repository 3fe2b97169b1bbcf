from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from wsss.utils.fileio import (
    atomic_open,
    atomic_write_text,
    read_image,
    read_mask,
    remove_stale_temporaries,
    save_mask,
    temporary_prefix,
)


def test_atomic_write_leaves_old_file_on_error(tmp_path):
    path = tmp_path / "out.txt"
    atomic_write_text(path, "old")

    class Boom(Exception):
        pass

    from wsss.utils.fileio import atomic_open

    with pytest.raises(Boom):
        with atomic_open(path, "w") as f:
            f.write("half")
            raise Boom
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_read_image_conversions(tmp_path):
    gray = np.arange(12, dtype=np.uint8).reshape(3, 4) * 20
    Image.fromarray(gray, mode="L").save(tmp_path / "g.png")
    out = read_image(tmp_path / "g.png")
    assert out.shape == (3, 4, 3) and (out[..., 0] == gray).all() and (out[..., 2] == gray).all()

    rgba = np.zeros((2, 2, 4), dtype=np.uint8)
    rgba[..., :3] = 200
    rgba[0, 0, 3] = 255
    rgba[1, 1, 3] = 0
    Image.fromarray(rgba, mode="RGBA").save(tmp_path / "a.png")
    out = read_image(tmp_path / "a.png")
    assert out[0, 0].tolist() == [200, 200, 200] and out[1, 1].tolist() == [0, 0, 0]

    deep = np.array([[0, 65535], [32768, 1000]], dtype=np.uint16)
    Image.fromarray(deep).save(tmp_path / "d.png")
    out = read_image(tmp_path / "d.png")
    assert out.dtype == np.uint8 and out[0, 1, 0] == 255 and out[0, 0, 0] == 0 and out[1, 0, 0] == 128


def test_read_image_applies_exif_orientation(tmp_path):
    arr = np.zeros((10, 20, 3), dtype=np.uint8)
    arr[:, :10] = 255  # left half white
    im = Image.fromarray(arr)
    exif = im.getexif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise for display
    im.save(tmp_path / "r.jpg", exif=exif, quality=100)
    out = read_image(tmp_path / "r.jpg")
    assert out.shape == (20, 10, 3)
    assert out[:8].mean() > 200 and out[12:].mean() < 50  # the white half is now on top


def test_read_image_corrupt_names_file(tmp_path):
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    with pytest.raises(ValueError, match="bad.jpg"):
        read_image(bad)
    good = tmp_path / "t.jpg"
    Image.fromarray(np.full((64, 64, 3), 9, np.uint8)).save(good)
    (tmp_path / "trunc.jpg").write_bytes(good.read_bytes()[:200])
    with pytest.raises(ValueError, match="trunc.jpg"):
        read_image(tmp_path / "trunc.jpg")


def test_mask_roundtrip_palette_and_rgb_rejected(tmp_path):
    mask = np.array([[0, 1, 255], [20, 3, 0]], dtype=np.uint8)
    from wsss.data.classes import voc_palette

    save_mask(tmp_path / "m.png", mask, voc_palette())
    assert Image.open(tmp_path / "m.png").mode == "P"
    assert (read_mask(tmp_path / "m.png") == mask).all()
    Image.fromarray(np.zeros((2, 2, 3), np.uint8)).save(tmp_path / "rgb.png")
    with pytest.raises(ValueError, match="rgb.png.*palette or grayscale"):
        read_mask(tmp_path / "rgb.png")


def test_atomic_write_uses_normal_permissions(tmp_path):

    umask = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "p.txt", "x")
    finally:
        os.umask(umask)
    assert (tmp_path / "p.txt").stat().st_mode & 0o777 == 0o644


def test_stale_temporaries_are_told_from_live_ones(tmp_path):
    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True).stdout)
    (tmp_path / "sub").mkdir()
    stale = [tmp_path / f"{temporary_prefix('a.png', dead)}abc_1234.tmp",
             tmp_path / "sub" / f"{temporary_prefix('b.npy', dead)}x.tmp"]  # fmt: skip
    kept = [tmp_path / f"{temporary_prefix('c.png')}zz.tmp", tmp_path / "d.tmp", tmp_path / ".e.png.tmp"]
    for p in stale + kept:
        p.write_bytes(b"x")
    assert remove_stale_temporaries(tmp_path) == [stale[0]]
    assert remove_stale_temporaries(tmp_path, recursive=True) == [stale[1]]
    assert all(p.exists() for p in kept)
    with atomic_open(tmp_path / "f.bin") as f:  # the name atomic_open gives is the one recognised
        (name,) = [p.name for p in tmp_path.glob(".f.bin.*")]
        assert name.startswith(temporary_prefix("f.bin")) and name.endswith(".tmp")
        f.write(b"y")
    assert remove_stale_temporaries(tmp_path) == []


def test_clean_up_keeps_user_files_and_other_hosts_temporaries(tmp_path):
    """Issue 31, 1.1: only files with the project's mark, of this host's dead processes, are deleted."""
    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True).stdout)
    kept = [
        tmp_path / f".report.{dead}.draft.tmp",  # a user's file named like the old temporaries
        tmp_path / f".a.png.{dead}.abc_1234.tmp",
        tmp_path / f"{temporary_prefix('a.png', dead, host='another-node')}k2j4h_x1.tmp",  # a shared folder
    ]
    stale = tmp_path / f"{temporary_prefix('a.png', dead)}k2j4h_x1.tmp"
    for p in [*kept, stale]:
        p.write_bytes(b"x")
    assert remove_stale_temporaries(tmp_path) == [stale]
    assert all(p.exists() for p in kept)


def test_temporary_of_a_long_name_fits_the_file_system(tmp_path):
    """Issue 31, 4: a 254-byte name (a 255-byte one, and a cut inside a UTF-8 character) is written atomically."""
    for name in ["x" * 250 + ".png", "y" * 251 + ".png", "\u00e9" * 125 + "e.png"]:
        atomic_write_text(tmp_path / name, "ok")
        assert (tmp_path / name).read_text() == "ok"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")) == []
