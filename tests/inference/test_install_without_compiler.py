"""No compiler needed: `make install` into a fresh venv on a PATH where every C/C++ compiler fails, then toy inference
with --crf there (the torch CRF; pydensecrf2 is a dev requirement only)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tools.test_wheelhouse import link_gpu_stack, needs_package_index

ROOT = Path(__file__).resolve().parents[2]
COMPILERS = ("cc", "gcc", "g++", "c++", "clang", "clang++")

pytestmark = [pytest.mark.slow, pytest.mark.skipif(sys.platform == "win32", reason="POSIX shell stubs")]


def no_compiler_path(folder: Path) -> str:
    """A PATH whose first folder holds a failing stub of every compiler name."""
    folder.mkdir()
    for name in COMPILERS:
        stub = folder / name
        stub.write_text("#!/bin/sh\necho \"$0: no compiler on this machine\" >&2\nexit 1\n")
        stub.chmod(0o755)
    return f"{folder}{os.pathsep}{os.environ['PATH']}"


def test_install_and_crf_inference_without_a_compiler(tmp_path, toy_checkpoint):
    needs_package_index()
    root, checkpoint = toy_checkpoint
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "CC", "CXX", "PYTHONPATH"))}
    env["PATH"] = no_compiler_path(tmp_path / "bin")
    blocked = subprocess.run(["cc", "--version"], env=env, capture_output=True, text=True)
    assert blocked.returncode != 0 and "no compiler" in blocked.stderr

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    link_gpu_stack(tmp_path / "gpu_stack")  # torch is a wheel anyway: spare the test its 3 GB download
    (Path(purelib) / "gpu_stack.pth").write_text(f"{tmp_path / 'gpu_stack'}\n")

    install = subprocess.run(["make", "install", f"VENV={venv}"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert install.returncode == 0, install.stderr[-3000:]
    missing = subprocess.run([python, "-c", "import pydensecrf"], cwd=tmp_path, env=env, capture_output=True)
    assert missing.returncode != 0  # the CRF below is the torch backend's

    out = tmp_path / "pred"
    run = subprocess.run(
        [python, str(ROOT / "tools" / "infer.py"), str(checkpoint), str(root / "JPEGImages"), str(out), "--crf",
         "--scales", "1", "--no-flip", "--workers", "0", "--no-progress"],
        cwd=tmp_path, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    images = sorted(p.stem for p in (root / "JPEGImages").glob("*.jpg"))
    assert sorted(p.stem for p in (out / "masks").glob("*.png")) == images
    used = subprocess.run([python, "-c", "import wsss; print(wsss.__file__)"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert used.startswith(str(ROOT / "wsss"))  # the package `make install` installed (editable)

    # the stubs do block a build: the reference CRF's sdist cannot install here
    pip = [python, "-m", "pip", "install", "--no-cache-dir", "--no-deps", "--no-binary", ":all:"]  # no cached wheel
    build = subprocess.run([*pip, "pydensecrf2"], env=env, capture_output=True, text=True)
    assert build.returncode != 0
