from __future__ import annotations

import os
import threading

import numpy as np
from PIL import Image

from wsss.data.folder import ImageFolderDataset
from wsss.utils.fileio import read_image


def test_folder_recursive_with_bad_files(tmp_path):
    (tmp_path / "sub" / "deeper").mkdir(parents=True)
    Image.fromarray(np.zeros((5, 7, 3), np.uint8)).save(tmp_path / "b.jpg")
    Image.fromarray(np.zeros((9, 4), np.uint8)).save(tmp_path / "sub" / "gray.png")
    Image.fromarray(np.zeros((3, 3, 4), np.uint8)).save(tmp_path / "sub" / "deeper" / "rgba.png")
    (tmp_path / "sub" / "corrupt.jpg").write_bytes(b"garbage")
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / ".hidden.jpg").write_bytes(b"x")

    ds = ImageFolderDataset(tmp_path)
    assert ds.files == ["b.jpg", "sub/corrupt.jpg", "sub/gray.png", "sub/deeper/rgba.png"]
    assert [(s.path, "not an image" in s.reason) for s in ds.skipped] == [("notes.txt", True)]
    items = [ds[i] for i in range(len(ds))]
    assert items[0]["image"].shape == (5, 7, 3) and items[0]["error"] is None
    assert items[1]["image"] is None and "not a readable image" in items[1]["error"]
    assert items[2]["image"].shape == (9, 4, 3)
    assert items[3]["image"].shape == (3, 3, 3)


def test_named_pipes_and_broken_links_are_skipped_with_a_reason(tmp_path):
    Image.fromarray(np.zeros((5, 7, 3), np.uint8)).save(tmp_path / "ok.jpg")
    os.mkfifo(tmp_path / "x.jpg")
    os.symlink(tmp_path / "x.jpg", tmp_path / "link_to_pipe.png")
    os.symlink(tmp_path / "gone.jpg", tmp_path / "broken.jpg")
    ds = ImageFolderDataset(tmp_path)
    assert ds.files == ["ok.jpg"]
    assert {s.path: s.reason for s in ds.skipped} == {
        "broken.jpg": "cannot be read (No such file or directory)",
        "link_to_pipe.png": "not a regular file (named pipe)",
        "x.jpg": "not a regular file (named pipe)",
    }


def test_reading_a_named_pipe_fails_at_once(tmp_path):
    """read_image on a pipe (listed by a split, say) raises instead of waiting for a writer forever."""
    os.mkfifo(tmp_path / "x.jpg")
    outcome = []

    def read():
        try:
            read_image(tmp_path / "x.jpg")
        except ValueError as err:
            outcome.append(str(err))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=20)
    if reader.is_alive():  # release the blocked open() so the thread ends, then fail
        with open(tmp_path / "x.jpg", "wb"):
            pass
    assert outcome == [f"{tmp_path / 'x.jpg'}: not a regular file (named pipe)"]
