from __future__ import annotations

import numpy as np
import pytest
from scipy.io import savemat

from tools import convert_sbd as convert_sbd_cli
from wsss.data.prepare.sbd import read_sbd_mat
from wsss.utils.fileio import read_mask, save_image


def write_sbd_mat(path, seg):
    path.parent.mkdir(parents=True, exist_ok=True)
    present = np.unique(seg[seg > 0]).astype(np.uint8)
    savemat(
        str(path),
        {"GTcls": {"Segmentation": seg, "Boundaries": np.zeros(1, dtype=object), "CategoriesPresent": present}},
    )


def test_read_mat_written_by_savemat(tmp_path):
    seg = np.zeros((7, 9), np.uint8)
    seg[2:5, 3:8] = 15
    write_sbd_mat(tmp_path / "cls" / "x.mat", seg)
    out = read_sbd_mat(tmp_path / "cls" / "x.mat")
    assert out.dtype == np.uint8 and (out == seg).all()


def test_read_mat_without_gtcls_names_file(tmp_path):
    savemat(str(tmp_path / "other.mat"), {"foo": np.ones(3)})
    with pytest.raises(ValueError, match="other.mat.*GTcls"):
        read_sbd_mat(tmp_path / "other.mat")


def test_convert_merges_and_writes_train_aug(tiny_voc, tmp_path):
    # VOC: train a1 a2 b1, val b1 b2. SBD: train s1 a1, val s2 b2 (b2 is VOC val, so excluded).
    sbd = tmp_path / "benchmark_RELEASE" / "dataset"
    masks = {}
    for i, image_id in enumerate(["s1", "a1", "s2", "b2"]):
        voc_mask = tiny_voc / "SegmentationClass" / f"{image_id}.png"
        h, w = (20 + i, 30) if image_id.startswith("s") else read_mask(voc_mask).shape
        seg = np.zeros((h, w), np.uint8)
        seg[1:5, 1:6] = i + 1
        masks[image_id] = seg
        write_sbd_mat(sbd / "cls" / f"{image_id}.mat", seg)
    save_image(sbd / "img" / "s1.jpg", np.zeros((20, 30, 3), np.uint8))
    save_image(sbd / "img" / "s2.jpg", np.zeros((22, 30, 3), np.uint8))
    (sbd / "train.txt").write_text("s1\na1\n")
    (sbd / "val.txt").write_text("s2\nb2\n")

    assert convert_sbd_cli.main([str(sbd.parent), str(tiny_voc)]) == 0

    aug = tiny_voc / "SegmentationClassAug"
    assert (read_mask(aug / "s1.png") == masks["s1"]).all()
    assert (read_mask(aug / "s2.png") == masks["s2"]).all()
    # VOC's own (finer) masks win over SBD's for ids both annotate
    assert (read_mask(aug / "a1.png") == read_mask(tiny_voc / "SegmentationClass" / "a1.png")).all()
    train_aug = (tiny_voc / "ImageSets" / "Segmentation" / "train_aug.txt").read_text().split()
    assert train_aug == ["a1", "a2", "s1", "s2"]  # (SBD train+val + VOC train) - VOC val
    assert (tiny_voc / "JPEGImages" / "s1.jpg").is_file()  # copied from SBD img/


def test_convert_missing_sbd_names_fix(tmp_path, tiny_voc, capsys):
    assert convert_sbd_cli.main([str(tmp_path / "nothing"), str(tiny_voc)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no SBD cls/ folder") and "benchmark_RELEASE" in err


@pytest.mark.parametrize("data", [b"", b"hello world" * 10], ids=["empty", "garbage"])
def test_corrupt_mat_names_its_file(tmp_path, tiny_voc, capsys, data):
    sbd = tmp_path / "dataset"
    (sbd / "cls").mkdir(parents=True)
    (sbd / "cls" / "s1.mat").write_bytes(data)
    with pytest.raises(ValueError, match="s1.mat: not an SBD class .mat file"):
        read_sbd_mat(sbd / "cls" / "s1.mat")
    assert convert_sbd_cli.main([str(sbd), str(tiny_voc)]) == 2
    assert f"error: {sbd / 'cls' / 's1.mat'}: not an SBD class .mat file" in capsys.readouterr().err
