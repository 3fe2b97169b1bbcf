"""bench/gpu_figures.sh, the command a lent GPU's one call runs (15 minutes of device time a session): every step's
command line parses, its config options name keys the config has, its test files exist, and the default steps fit
one call. A step that drifted from its bench's options would cost its share of the device's time and its figures."""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from wsss.config import load_config, parse_cfg_options

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "bench" / "gpu_figures.sh"
CALL_LIMIT_S = 600
"""The device tool's limit on one command (``per_call_limit_s``)."""


def steps() -> dict[str, tuple[int, list[str]]]:
    """Each step of the script's ``case``: its time cap and its command's words (``"${pytest[@]}"`` kept as a word)."""
    text = SCRIPT.read_text().replace("\\\n", " ")
    found = re.findall(r"^\s+(\w+)\) step \"\$name\" (\d+) (.*?) ;;$", text, re.M)
    return {name: (int(limit), shlex.split(command.replace('"${pytest[@]}"', "PYTEST"))) for name, limit, command
            in found}  # fmt: skip


class Parsed(Exception):
    """Raised by the patched parser with the namespace it made: the bench stops before it measures anything."""

    def __init__(self, namespace: argparse.Namespace) -> None:
        super().__init__()
        self.namespace = namespace


def parsed(script: str, argv: list[str], monkeypatch: pytest.MonkeyPatch) -> argparse.Namespace:
    """``script``'s options parsed as its ``main(argv)`` parses them, on a machine without a GPU."""
    monkeypatch.syspath_prepend(str(REPO / "bench"))  # the benches import their neighbours, as when run from there
    spec = importlib.util.spec_from_file_location(Path(script).stem, REPO / script)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # as a script is (its dataclasses look themselves up there)
    spec.loader.exec_module(module)
    real = argparse.ArgumentParser.parse_args

    def parse_and_stop(self, args=None, namespace=None):
        raise Parsed(real(self, args, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_and_stop)
    with pytest.raises(Parsed) as stopped:
        module.main(argv)
    return stopped.value.namespace


def test_every_step_is_known_and_the_defaults_fit_one_call():
    text = SCRIPT.read_text()
    found = steps()
    assert {"train_toy", "train_bf16", "train_exact", "train_fp32", "infer_voc", "infer_coco", "infer_voc_bf16",
            "infer_coco_bf16", "crf", "loader", "export", "tests", "suite"} <= set(found)  # fmt: skip
    defaults = re.search(r"steps=\(([\w ]+)\)\n", text).group(1).split()
    assert set(defaults) <= set(found)
    assert sum(found[name][0] for name in defaults) <= CALL_LIMIT_S - 30  # and the kit's start, nvidia-smi, the table
    unknown = re.search(r"unknown step '\$name' \((.*?)\)\" >&2", text.replace('" \\\n      "', " ")).group(1)
    assert sorted(unknown.split()) == sorted(found)  # the error lists every step


@pytest.mark.parametrize("name", sorted(n for n, (_, words) in steps().items() if words[0].startswith("bench/")))
def test_each_bench_step_parses_and_its_config_options_exist(name, monkeypatch):
    _, (script, *argv) = steps()[name]
    args = parsed(script, argv, monkeypatch)
    assert getattr(args, "device", "cuda") == "cuda" and getattr(args, "cuda_only", True)  # the GPU, where it can
    if getattr(args, "cfg_options", None):  # keys the config lacks, or values out of range, stop the bench there
        load_config(REPO / getattr(args, "config", "configs/voc_centered.py"), parse_cfg_options(args.cfg_options))


@pytest.mark.parametrize("name", sorted(n for n, (_, words) in steps().items() if words[0] == "PYTEST"))
def test_each_test_step_names_test_files_that_exist(name):
    paths = [word for word in steps()[name][1][1:] if word.startswith("tests")]
    assert paths and all((REPO / path).exists() for path in paths), paths


def test_a_failure_s_traceback_is_written_as_it_happens(tmp_path):
    """The test steps' plugin (tests/failure_log.py): a failure's report reaches the file when the test ends, not when
    the run does (a step cut at its cap keeps it); a passing test writes nothing."""
    (tmp_path / "test_planted.py").write_text(
        "def test_passes():\n    assert True\n\n"
        "def test_fails():\n    value = 41\n    assert value == 42, 'the planted failure'\n\n"
        "def test_sees_the_log_before_the_run_ends():\n"
        f"    assert 'test_fails' in open({str(tmp_path / 'failures.log')!r}).read()\n"
    )  # fmt: skip
    assert "-p tests.failure_log --failure-log" in SCRIPT.read_text().replace("\n ", "")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "-p", "tests.failure_log",
         "--failure-log", str(tmp_path / "failures.log"), "--rootdir", str(tmp_path),
         str(tmp_path / "test_planted.py")],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert "1 failed, 2 passed" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
    log = (tmp_path / "failures.log").read_text()
    assert "test_planted.py::test_fails (call)" in log and "assert 41 == 42" in log and "test_passes" not in log
