"""The start-up helpers of every tool (wsss/utils/startup.py): the default CPU threads, applying them, the one-line
error for a missing input, and the NVIDIA driver check."""

from __future__ import annotations

import argparse
import os

import pytest
import torch

from tests.conftest import tiny_config
from wsss.config import CrfConfig
from wsss.utils import startup


@pytest.fixture
def eight_cpus(monkeypatch):
    """This process may use 8 CPUs (whatever the machine has); no torchrun environment."""
    monkeypatch.setattr(startup.os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)


@pytest.mark.usefixtures("eight_cpus")
def test_default_threads_share_the_cpus_among_local_ranks_less_the_workers(monkeypatch):
    assert startup.available_cpus() == 8 and startup.local_ranks() == 1
    assert [startup.default_threads(w) for w in (0, 2, 7, 8, 20)] == [8, 6, 1, 1, 1]
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # torchrun --nproc-per-node 2: 4 CPUs per rank
    assert [startup.default_threads(w) for w in (0, 1, 3, 4)] == [4, 3, 1, 1]
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")  # 8 // 3 = 2 each: never more threads than CPUs in all
    assert startup.default_threads() == 2
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "16")  # more ranks than CPUs: one thread each
    assert startup.default_threads() == 1
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "0")
    with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE='0' is not a positive integer"):
        startup.default_threads()


def test_available_cpus_is_the_affinity_mask_not_the_machine():
    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("no affinity mask on this platform")
    assert startup.available_cpus() == len(os.sched_getaffinity(0)) <= os.cpu_count()


@pytest.mark.usefixtures("eight_cpus")
def test_apply_threads_sets_torch_and_omp_num_threads(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")  # under torchrun, 1 is torchrun's own value: not the user's
    before = torch.get_num_threads()
    try:
        assert startup.apply_threads(None, workers=2) == 6
        assert torch.get_num_threads() == 6 and os.environ["OMP_NUM_THREADS"] == "6"
        assert startup.apply_threads(3, workers=2) == 3  # --threads wins
        assert torch.get_num_threads() == 3 and os.environ["OMP_NUM_THREADS"] == "3"
    finally:
        torch.set_num_threads(before)


@pytest.mark.usefixtures("eight_cpus")
def test_threads_beside_workers_keep_the_users_choice():
    """Once a tool knows the processes it starts (a checkpoint's CRF workers), the model gets the CPUs they leave,
    unless the user chose its threads."""
    before = torch.get_num_threads()
    try:
        startup.threads_beside(3, None)
        assert torch.get_num_threads() == 5
        torch.set_num_threads(2)
        startup.threads_beside(3, 2)  # --threads 2 (or OMP_NUM_THREADS=2), already applied: kept
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_threads_argument_takes_positive_integers_only(capsys):
    parser = argparse.ArgumentParser()
    startup.add_threads_argument(parser)
    assert parser.parse_args([]).threads is None and parser.parse_args(["--threads", "4"]).threads == 4
    for bad in ("0", "-1", "two"):
        with pytest.raises(SystemExit):
            parser.parse_args(["--threads", bad])
    assert "--threads: needs a positive integer, got 'two'" in capsys.readouterr().err


def test_config_workers_count_the_loaders_and_the_crf_processes(tmp_path):
    cfg = tiny_config(tmp_path)
    cfg.data.num_workers = 1
    cfg.infer.crf = CrfConfig(backend="pydensecrf", workers=2)
    assert startup.config_workers(cfg) == 1 and startup.config_workers(cfg, crf=True) == 3
    assert startup.config_workers(cfg, crf=True, device="cuda") == 3
    cfg.infer.crf = CrfConfig(backend="torch", workers=2)  # processes on the CPU, the rank's own GPU on a GPU
    assert [startup.config_workers(cfg, True, d) for d in (None, "cpu", "cuda", "cuda:1")] == [3, 3, 1, 1]


def test_input_error_names_the_file_and_the_fix(tmp_path):
    (tmp_path / "toy_centered.py").write_text("")
    (tmp_path / "folder").mkdir()
    assert startup.input_error({"config": tmp_path / "toy_centered.py", "checkpoint": None}) is None
    assert startup.input_error({"config": tmp_path / "toy_centred.py"}) == (
        f"config {tmp_path}/toy_centred.py not found: did you mean {tmp_path}/toy_centered.py?"
    )
    assert startup.input_error({"checkpoint": tmp_path / "x.pth"}) == (
        f"checkpoint {tmp_path}/x.pth not found: no file of that name in {tmp_path}"
    )
    assert startup.input_error({"checkpoint": tmp_path / "nowhere" / "x.pth"}) == (
        f"checkpoint {tmp_path}/nowhere/x.pth not found: there is no folder {tmp_path}/nowhere"
    )
    assert startup.input_error({"config": tmp_path / "folder"}) == (
        f"config {tmp_path}/folder is a folder, not a file: give one of its files (it holds none)"
    )
    assert startup.input_error({"config": tmp_path}) == (
        f"config {tmp_path} is a folder, not a file: give one of its files, e.g. {tmp_path}/toy_centered.py"
    )
    assert startup.input_error({}, {"IMAGES": tmp_path / "toy_centered.py"}) == (
        f"IMAGES {tmp_path}/toy_centered.py is not a folder; give the IMAGES folder"
    )
    assert startup.input_error({}, {"IMAGES": tmp_path / "folder"}) is None


def test_nvidia_driver_error_is_none_where_any_sign_of_the_driver_is(monkeypatch, tmp_path):
    monkeypatch.setattr(startup, "NVIDIA_DRIVER_FILE", tmp_path / "version")
    monkeypatch.setattr(startup, "find_library", lambda name: None)
    monkeypatch.setattr(startup.shutil, "which", lambda name: None)
    assert startup.nvidia_driver_error().startswith(f"no CUDA device is visible: no NVIDIA driver here (no {tmp_path}")
    (tmp_path / "version").write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.00\n")
    assert startup.nvidia_driver_error() is None
    (tmp_path / "version").unlink()
    monkeypatch.setattr(startup, "find_library", lambda name: "libcuda.so.1" if name == "cuda" else None)  # WSL
    assert startup.nvidia_driver_error() is None


@pytest.mark.usefixtures("eight_cpus")
@pytest.mark.parametrize(
    ("omp", "torchrun", "expected"),
    [("3", False, 3), ("1", False, 1), ("5", True, 5), ("1", True, 6), (None, False, 6), ("0", False, 6),
     ("two", False, 6)],
)  # fmt: skip
def test_the_users_omp_num_threads_is_the_default_but_torchruns_own_1(monkeypatch, omp, torchrun, expected):
    """A user's OMP_NUM_THREADS is honoured, as torch honours it; torchrun sets 1 for every rank when the user has
    not, so under torchrun 1 gives way to the rank's share."""
    for name, value in (("OMP_NUM_THREADS", omp), ("LOCAL_WORLD_SIZE", "1" if torchrun else None)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    before = torch.get_num_threads()
    try:
        assert startup.apply_threads(None, workers=2) == expected == torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
