"""``python tools/X.py --help`` answers at once: every tool parses its arguments before it imports torch, timm,
albumentations, mmengine, mmseg, cv2 or matplotlib, and its help is the usage line and the module docstring."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOLS = sorted(p.name for p in (ROOT / "tools").glob("*.py") if p.name != "__init__.py")
HEAVY = ("torch", "timm", "albumentations", "mmengine", "mmseg", "cv2", "matplotlib")
IMPORT_LINE = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s*([\w.]+)$", re.MULTILINE)


def imported_packages(importtime_log: str) -> set[str]:
    """Top-level packages named in the ``-X importtime`` log (stderr) of a run."""
    return {name.split(".")[0] for name in IMPORT_LINE.findall(importtime_log)}


def test_imported_packages_reads_the_importtime_log():  # the check below would pass on an unread log
    run = subprocess.run([sys.executable, "-X", "importtime", "-c", "import json.decoder, cv2"], capture_output=True,
                         text=True, timeout=120, check=True)  # fmt: skip
    packages = imported_packages(run.stderr)
    assert {"json", "cv2"} <= packages and "torch" not in packages


@pytest.mark.parametrize("tool", TOOLS)
def test_help_prints_the_docstring_without_heavy_imports(tool):
    run = subprocess.run(
        [sys.executable, "-X", "importtime", f"tools/{tool}", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, (run.returncode, IMPORT_LINE.sub("", run.stderr).strip()[-2000:])
    assert run.stdout.startswith(f"usage: {tool} "), run.stdout[:200]
    summary = ast.get_docstring(ast.parse((ROOT / "tools" / tool).read_text())).splitlines()[0]
    assert " ".join(summary.split()) in " ".join(run.stdout.split())  # argparse may rewrap the description
    heavy = sorted(imported_packages(run.stderr) & set(HEAVY))
    assert not heavy, f"tools/{tool} --help imported {heavy}"


@pytest.mark.parametrize(
    ("tool", "says"),
    [
        ("test.py", ["--work-dir", "work_dirs/<config name>", "test_<checkpoint name>", "--out", "--show-dir"]),
        ("eval_cams.py", ["--work-dir", "cam_eval_<checkpoint name>_<split>", "--safetensors export"]),
        ("export.py", [".safetensors", "--onnx"]),
        ("infer.py", ["--list", "--launcher", "per rank", "photo_pred/"]),
    ],
)
def test_help_says_where_the_outputs_go(tool, says):
    run = subprocess.run([sys.executable, f"tools/{tool}", "--help"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, check=True)  # fmt: skip
    text = " ".join(run.stdout.split())
    for phrase in says:
        assert phrase in text, phrase
