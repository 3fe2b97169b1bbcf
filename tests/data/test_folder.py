from __future__ import annotations

import numpy as np
from PIL import Image

from wsss.data.folder import ImageFolderDataset


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
