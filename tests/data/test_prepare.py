"""``tools/prepare_data.py`` end to end on small archives with the real ones' layout, served on 127.0.0.1 or taken
from a folder: the whole chain to a dataset check_dataset accepts, resume, refusal of a corrupt archive, re-runs."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import pytest

from tests.data.archive_server import TRAIN_AUG, ArchiveServer, make_coco_archives, make_voc_archives
from tools import check_dataset as check_dataset_cli
from tools import prepare_data
from wsss.config import load_config
from wsss.data.classes import VOC_CLASSES
from wsss.data.download import Archive
from wsss.data.labels import load_labels
from wsss.data.prepare import DATASETS
from wsss.data.sbd import read_sbd_mat
from wsss.utils.fileio import read_mask

REPO = Path(__file__).resolve().parents[2]
VOC_STEPS = 5  # unpack x2, convert_sbd, labels, check_dataset


def write_md5sums(path: Path, archives: list[Archive]) -> Path:
    path.write_text("".join(f"{a.md5}  {a.name}\n" for a in archives))
    return path


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def voc_served(tmp_path):
    """(server, the md5sum file of the generated archives, the archives' folder)."""
    folder = tmp_path / "served"
    folder.mkdir()
    sums = write_md5sums(tmp_path / "MD5SUMS", make_voc_archives(folder))
    with ArchiveServer(folder) as server:
        yield server, sums, folder


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = prepare_data.main([*map(str, argv), "--no-progress"])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_dataset_settings_are_the_configs():
    for name, config in (("voc", "voc_centered.py"), ("coco", "coco_centered.py")):
        data = load_config(str(REPO / "configs" / config)).data
        spec = DATASETS[name]
        assert data.root == f"data/{spec.data['root']}", name  # ROOT = data, as the README runs it
        assert all(getattr(data, k) == v for k, v in spec.data.items() if k != "root"), name


def test_voc_from_nothing_to_a_checked_dataset_then_rerun_skips(voc_served, tmp_path, capsys):
    server, sums, _ = voc_served
    root = tmp_path / "data"
    code, out, err = run_cli(capsys, "voc", root, "--mirror", server.url, "--checksums", sums)
    assert code == 0, err
    assert [name for name, _ in server.requests] == ["VOCtrainval_11-May-2012.tar", "benchmark.tgz"]
    voc = root / "VOCdevkit" / "VOC2012"
    assert (voc / "ImageSets" / "Segmentation" / "train_aug.txt").read_text().split() == TRAIN_AUG
    sbd_only = read_sbd_mat(root / "benchmark_RELEASE" / "dataset" / "cls" / "2008_000002.mat")
    assert (read_mask(voc / "SegmentationClassAug" / "2008_000002.png") == sbd_only).all()
    labels = load_labels(voc / "cls_labels.json", list(VOC_CLASSES))
    assert labels["2007_000032"].nonzero()[0].tolist() == [0, 14]  # aeroplane, person
    assert out.count(": no problems found") == 1
    assert out.rstrip().endswith(f"data.root = {voc}; the archives in {root / 'downloads'} may be deleted")
    # the config's own check agrees
    assert check_dataset_cli.main([str(REPO / "configs" / "voc_centered.py"), "--no-progress", "--cfg-options",
                                   f"data.root={voc}"]) == 0  # fmt: skip
    capsys.readouterr()

    code, out, _ = run_cli(capsys, "voc", root, "--mirror", server.url, "--checksums", sums)
    assert code == 0 and out.count("finished before, skipped") == VOC_STEPS and len(server.requests) == 2

    # an unpacked folder gone: that step and those derived from it run again, from the kept archive
    shutil.rmtree(root / "VOCdevkit")
    code, out, _ = run_cli(capsys, "voc", root, "--mirror", server.url, "--checksums", sums)
    assert code == 0 and len(server.requests) == 2
    assert "[2/5] unpack benchmark.tgz: finished before, skipped" in out and out.count("skipped") == 1
    assert (voc / "cls_labels.json").is_file() and (voc / "ImageSets/Segmentation/train_aug.txt").is_file()


def test_interrupted_download_resumes(voc_served, tmp_path, capsys):
    server, sums, folder = voc_served
    server.cut["benchmark.tgz"] = 700
    root = tmp_path / "data"
    code, out, err = run_cli(capsys, "voc", root, "--mirror", server.url, "--checksums", sums)
    size = (folder / "benchmark.tgz").stat().st_size
    assert code == 2 and err.count("\n") == 1
    assert err.endswith(f"stopped at 700 of {size:,} bytes; run again to resume it\n")
    assert "[1/5] unpack VOCtrainval_11-May-2012.tar: " in out and not (root / "benchmark_RELEASE").exists()
    code, out, err = run_cli(capsys, "voc", root, "--mirror", server.url, "--checksums", sums)
    assert code == 0, err
    assert server.requests[-1] == ("benchmark.tgz", "bytes=700-")
    assert (root / "downloads" / "benchmark.tgz").read_bytes() == (folder / "benchmark.tgz").read_bytes()


def test_corrupt_archive_refused_in_one_line(voc_served, tmp_path, capsys):
    server, sums, folder = voc_served
    tar = folder / "VOCtrainval_11-May-2012.tar"
    data = tar.read_bytes()
    tar.write_bytes(data[:1000] + bytes([data[1000] ^ 0xFF]) + data[1001:])
    root = tmp_path / "data"
    code, _, err = run_cli(capsys, "voc", root, "--mirror", server.url, "--checksums", sums)
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"error: {root / 'downloads' / tar.name}: MD5 ") and "delete it and run again" in err
    assert not (root / "VOCdevkit").exists()


def test_no_network_in_one_line(tmp_path, capsys):
    url = closed_port_url()
    code, _, err = run_cli(capsys, "voc", tmp_path / "data", "--mirror", url)
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"error: cannot reach {url}/VOCtrainval_11-May-2012.tar (") and "--archives DIR" in err


def test_archives_folder_without_network(tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    sums = write_md5sums(tmp_path / "MD5SUMS", make_voc_archives(mine))
    root = tmp_path / "data"
    offline = closed_port_url()  # a download would fail
    code, out, err = run_cli(capsys, "voc", root, "--archives", mine, "--checksums", sums, "--mirror", offline)
    assert code == 0, err
    assert f"{mine / 'benchmark.tgz'} -> {root / 'benchmark_RELEASE'}" in out and not (root / "downloads").exists()
    assert out.rstrip().endswith(f"ready: data.root = {root / 'VOCdevkit' / 'VOC2012'}")


def test_coco_from_archives(tmp_path, capsys):
    pytest.importorskip("pycocotools")
    mine = tmp_path / "mine"
    mine.mkdir()
    sums = write_md5sums(tmp_path / "MD5SUMS", make_coco_archives(mine))
    root = tmp_path / "data"
    code, out, err = run_cli(capsys, "coco", root, "--archives", mine, "--checksums", sums)
    assert code == 0, err
    coco = root / "coco"
    assert (coco / "ImageSets" / "Segmentation" / "val_part.txt").read_text().split() == [
        f"val2014/COCO_val2014_{i:012d}" for i in (1, 2, 3)]  # fmt: skip
    assert json.loads((coco / "cls_labels.json").read_text())["classes"] == ["background", "person", "car"]
    assert check_dataset_cli.main([str(REPO / "configs" / "coco_centered.py"), "--no-progress", "--cfg-options",
                                   f"data.root={coco}"]) == 0  # fmt: skip


def test_missing_archives_folder_named(tmp_path, capsys):
    code, _, err = run_cli(capsys, "voc", tmp_path / "data", "--archives", tmp_path / "nowhere")
    assert (code, err) == (
        2, f"error: --archives {tmp_path / 'nowhere'} not found: no folder of that name in {tmp_path}\n"
    )
