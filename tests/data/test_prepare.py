"""``tools/prepare_data.py`` end to end on small archives with the real ones' layout, served on 127.0.0.1 or taken
from a folder: the whole chain to a dataset check_dataset accepts, resume, refusal of a corrupt archive, re-runs,
damaged records, Ctrl-C, and one line for every wrong option."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.data.archive_server import TRAIN_AUG, ArchiveServer, make_coco_archives, make_voc_archives
from tools import check_dataset as check_dataset_cli
from tools import prepare_data
from wsss.config import load_config
from wsss.data.classes import VOC_CLASSES
from wsss.data.labels import load_labels
from wsss.data.prepare import pipeline as prepare_module
from wsss.data.prepare.download import Archive, PrepareError
from wsss.data.prepare.pipeline import DATASETS
from wsss.data.prepare.sbd import read_sbd_mat
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
    assert (code, err) == (0, "")  # --no-progress: no bar of any step
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
    assert (code, err) == (0, "")
    assert "loading annotations" not in out and "index created" not in out  # pycocotools' own prints
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


@pytest.mark.parametrize(
    ("option", "says"),
    [(["--timeout", "-1"], "--timeout -1.0: give the seconds to wait for a silent server, more than 0 and at most "
                           "86400, e.g. --timeout 30"),
     (["--timeout", "nan"], "--timeout nan: give the seconds"),
     (["--timeout", "1e12"], "--timeout 1000000000000.0: give the seconds"),
     (["--mirror", "http://[::1/x"], "--mirror 'http://[::1/x': not a URL (Invalid IPv6 URL); give the address that "
                                     "serves URL/<archive name>, e.g. --mirror https://host/voc"),
     (["--mirror", "http://host/my archives"], "--mirror 'http://host/my archives': it holds a space")],
)  # fmt: skip
def test_wrong_option_refused_in_one_line_before_any_work(tmp_path, capsys, option, says):
    root = tmp_path / "data"
    code, out, err = run_cli(capsys, "voc", root, *option)
    assert (code, out) == (2, "") and err.startswith(f"error: {says}") and err.count("\n") == 1
    assert not root.exists()


def test_checksums_file_not_utf8_refused_in_one_line(tmp_path, capsys):
    sums = tmp_path / "MD5SUMS"
    sums.write_bytes(b"\xe9t\xe9  VOCtrainval_11-May-2012.tar\n")
    code, _, err = run_cli(capsys, "voc", tmp_path / "data", "--checksums", sums)
    assert (code, err) == (2, f"error: {sums}: not UTF-8 text (byte 0); give an md5sum-format file, '<md5>  <name>' "
                              "per line\n")  # fmt: skip
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("damage", [b'{"summary": ', b"[]", b'{"outputs": 5}', b'{"outputs": [1]}', b"\xff",
                                    b"[" * 100_000])  # fmt: skip
def test_damaged_step_record_runs_the_step_again(voc_served, tmp_path, capsys, damage):
    server, sums, _ = voc_served
    root = tmp_path / "data"
    assert run_cli(capsys, "voc", root, "--mirror", server.url, "--checksums", sums)[0] == 0
    for name in ("labels", "check_dataset"):
        (root / ".prepare" / "voc" / f"{name}.json").write_bytes(damage)
    code, out, err = run_cli(capsys, "voc", root, "--mirror", server.url, "--checksums", sums)
    assert (code, err) == (0, "")
    assert "[4/5] labels: labels of 5 images" in out and "[5/5] check_dataset: " in out
    assert out.count("finished before, skipped") == 3


def test_damaged_unpack_record_refused_in_one_line_naming_the_folder(voc_served, tmp_path, capsys):
    server, sums, _ = voc_served
    root = tmp_path / "data"
    assert run_cli(capsys, "voc", root, "--mirror", server.url, "--checksums", sums)[0] == 0
    (root / ".prepare" / "voc" / "unpack_benchmark.tgz.json").write_text('{"outputs": ')
    code, _, err = run_cli(capsys, "voc", root, "--mirror", server.url, "--checksums", sums)
    assert (code, err) == (2, f"error: {root / 'benchmark_RELEASE'} exists but was not unpacked by this tool from "
                              "benchmark.tgz; move it away and run again\n")  # fmt: skip


def test_a_step_that_runs_again_loses_its_record_first(tmp_path):
    out, state = tmp_path / "out.txt", tmp_path / "state"

    def make() -> tuple[str, list[Path]]:
        out.write_text("whole")
        return "made", [out]

    def fail_after_writing() -> tuple[str, list[Path]]:
        out.write_text("half")
        raise PrepareError("failed midway")

    prepare_module._run([prepare_module._Step("make", make, derived=False)], state, print)
    out.unlink()  # the step's output gone: it runs again, and fails after writing it anew
    with pytest.raises(PrepareError):
        prepare_module._run([prepare_module._Step("make", fail_after_writing, derived=False)], state, print)
    lines = []
    prepare_module._run([prepare_module._Step("make", make, derived=False)], state, lines.append)
    assert not any("skipped" in line for line in lines) and out.read_text() == "whole"


@pytest.mark.slow
def test_ctrl_c_during_a_download_ends_in_one_line(voc_served, tmp_path):
    server, sums, _ = voc_served

    def trickle(wfile, body: bytes) -> None:
        for byte in body:
            wfile.write(bytes([byte]))
            time.sleep(0.02)

    server.send["VOCtrainval_11-May-2012.tar"] = trickle
    root = tmp_path / "data"
    part = root / "downloads" / "VOCtrainval_11-May-2012.tar.part"
    cmd = [sys.executable, "tools/prepare_data.py", "voc", str(root), "--mirror", server.url, "--checksums", str(sums),
           "--no-progress"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, env=os.environ, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (part.is_file() and part.stat().st_size > 0) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=60)[1]
    assert proc.returncode == 130 and err.count("\n") == 1, err
    assert err.startswith("error: interrupted (Ctrl-C); run the same command again") and part.stat().st_size > 0
