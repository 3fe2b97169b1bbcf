"""What every tool does at start-up (wsss/utils/startup.py): a missing input is refused in one line before torch is
imported, and every tool that computes takes ``--threads`` and applies it through the one helper."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.tools.test_help import HEAVY, ROOT, TOOLS, imported_packages

CONFIG = "configs/toy_centered.py"

COMPUTING = {  # tool -> arguments that pass its input checks (files: see `inputs`)
    "ablate.py": [CONFIG],
    "diagnose.py": ["{folder}", "--config", CONFIG],
    "eval.py": ["{folder}", "{folder}"],
    "eval_cams.py": ["{file}"],
    "export.py": ["{file}", "--safetensors", "{out}"],
    "gpu_check.py": [CONFIG, "--out", "{out}"],
    "infer.py": ["{file}", "{folder}", "{out}"],
    "make_pseudo_labels.py": ["{file}", "{out}"],
    "pretrain.py": [CONFIG],
    "simulate_rank.py": ["--out", "{out}"],
    "test.py": [CONFIG, "{file}"],
    "train.py": [CONFIG],
}
NOT_COMPUTING = {  # no torch computation: files, downloads, JSON, PIL decoding
    "check_dataset.py", "convert_coco.py", "convert_sbd.py", "make_cls_labels.py", "make_toy_voc.py",
    "prepare_data.py", "report.py", "reproduce.py", "wheelhouse.py",
}  # fmt: skip
"""(``reproduce.py`` runs the computing tools as processes, each with its own default threads.)"""


class Applied(BaseException):
    """Raised by the stand-in of apply_threads: the tool got there (no tool catches a BaseException)."""


def test_every_tool_is_classed():  # a new tool must say whether it computes (and then take --threads)
    assert sorted([*COMPUTING, *NOT_COMPUTING]) == TOOLS


@pytest.mark.parametrize("tool", sorted(COMPUTING))
def test_every_computing_tool_takes_threads_and_applies_it(tool, tmp_path, monkeypatch):
    (tmp_path / "model.pth").write_bytes(b"")  # only its existence is checked before the threads
    (tmp_path / "images").mkdir()
    inputs = {"{file}": str(tmp_path / "model.pth"), "{folder}": str(tmp_path / "images"), "{out}": str(tmp_path / "o")}
    module = __import__(f"tools.{tool[:-3]}", fromlist=["main"])
    applied = []

    def stand_in(threads, workers=0):
        applied.append((threads, workers))
        raise Applied

    monkeypatch.setattr(module, "apply_threads", stand_in)
    if tool == "gpu_check.py":
        monkeypatch.setattr(module, "nvidia_driver_error", lambda: None)
    monkeypatch.chdir(ROOT)
    with pytest.raises(Applied):
        module.main([inputs.get(a, a) for a in COMPUTING[tool]] + ["--threads", "3"])
    assert len(applied) == 1 and applied[0][0] == 3 and applied[0][1] >= 0


MISSING = [  # tool, arguments, the start of the one error line
    ("test.py", ["configs/toy_centred.py", "x.pth"], "config configs/toy_centred.py not found: did you mean"),
    ("test.py", [CONFIG, "missing/x.pth"], "checkpoint missing/x.pth not found: there is no folder missing"),
    ("train.py", ["configs/toy_centred.py"], "config configs/toy_centred.py not found"),
    ("train.py", [CONFIG, "--resume", "missing.pth"], "--resume checkpoint missing.pth not found"),
    ("pretrain.py", ["configs/toy_centred.py"], "config configs/toy_centred.py not found"),
    ("ablate.py", ["configs/toy_centred.py"], "config configs/toy_centred.py not found"),
    ("eval.py", ["missing_pred", "missing_gt"], "pred_dir missing_pred not found"),
    ("eval_cams.py", ["missing.pth"], "checkpoint missing.pth not found"),
    ("export.py", ["missing.pth", "--onnx", "x.onnx"], "checkpoint missing.pth not found"),
    ("infer.py", ["missing.pth", "in", "out"], "checkpoint missing.pth not found"),
    ("infer.py", ["README.md", "missing_input"], "INPUT missing_input not found"),
    ("make_pseudo_labels.py", ["missing.pth", "out"], "checkpoint missing.pth not found"),
    ("diagnose.py", ["missing.pth", "data"], "checkpoint 1 missing.pth not found"),
    ("check_dataset.py", ["configs/toy_centred.py"], "config configs/toy_centred.py not found"),
    ("convert_sbd.py", ["data", "missing_voc"], "VOC_ROOT missing_voc not found"),
    ("prepare_data.py", ["voc", "--archives", "missing_archives"], "--archives missing_archives not found"),
]


@pytest.mark.parametrize(("tool", "args", "says"), MISSING, ids=[f"{t}-{a[-1]}" for t, a, _ in MISSING])
def test_a_missing_input_is_one_line_before_torch(tool, args, says):
    run = subprocess.run([sys.executable, "-X", "importtime", f"tools/{tool}", *args], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    err = "\n".join(line for line in run.stderr.splitlines() if not line.startswith("import time:"))
    assert run.returncode == 2 and err.count("\n") == 0 and err.startswith(f"error: {says}"), err[-2000:]
    assert not sorted(imported_packages(run.stderr) & set(HEAVY)), f"tools/{tool} imported heavy packages first"


def test_gpu_check_without_a_driver_refuses_before_torch(tmp_path):
    script = (
        "import sys, shutil\n"
        "from pathlib import Path\n"
        "from wsss.utils import startup\n"
        f"startup.NVIDIA_DRIVER_FILE = Path({str(tmp_path / 'version')!r})\n"
        "startup.find_library = lambda name: None\n"
        "shutil.which = lambda *a, **k: None\n"
        "from tools import gpu_check\n"
        f"code = gpu_check.main(['--out', {str(tmp_path / 'out')!r}])\n"
        "print('torch' in sys.modules, code)\n"
    )
    run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.stdout.split() == ["False", "2"], run.stderr[-2000:]
    assert run.stderr.strip() == (
        f"error: no CUDA device is visible: no NVIDIA driver here (no {tmp_path / 'version'}, no libcuda, no "
        "nvidia-smi); make gpu-check needs a machine with an NVIDIA GPU and its driver"
    )
    assert not (tmp_path / "out").exists()


def test_make_gpu_check_refuses_before_building_the_venv(tmp_path):
    from wsss.utils.startup import nvidia_driver_error

    if nvidia_driver_error() is None:
        pytest.skip("an NVIDIA driver is visible here: make gpu-check would build the venv and run")
    venv = tmp_path / "venv"
    run = subprocess.run(["make", "gpu-check", f"VENV={venv}"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and f"error: {nvidia_driver_error()}" in run.stderr.splitlines(), run.stderr[-2000:]
    assert not venv.exists()


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [1, 2])
def test_each_torchrun_rank_sets_its_threads_over_torchruns_omp_num_threads(tmp_path, ranks):
    """torchrun sets OMP_NUM_THREADS=1 for every rank when it is unset (and prints its notice from the launcher,
    before any rank starts: out of the tools' reach); each rank then sets its own share, the CPUs / ranks."""
    import os

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    expected = max(1, cpus // ranks)
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # torchrun sets 1
    args = ["--depth", "2", "--gammas", "0", "--archs", "pre_ln", "--inits", "identity", "--no-progress"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
           "tools/simulate_rank.py", *args, "--out", str(tmp_path)]  # fmt: skip
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count(f"with {expected} thread(s)") == ranks, run.stdout
