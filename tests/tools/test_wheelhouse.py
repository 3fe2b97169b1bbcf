"""make wheelhouse / make install-offline: every requirement but the GPU stack as wheels, installed with pip
--no-index into a fresh venv that sees only an installed torch, as on a cluster node without internet."""

from __future__ import annotations

import functools
import os
import socket
import subprocess
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import metadata
from pathlib import Path

import pytest

from tools.wheelhouse import PREINSTALLED, normalize, offline_requirements, requirement_name

ROOT = Path(__file__).resolve().parents[2]


def test_offline_requirements_leave_out_exactly_the_gpu_stack():
    lines = offline_requirements()
    names = [requirement_name(line) for line in lines]
    assert "torch" not in names and "torchvision" not in names and "triton" not in names
    assert {"timm", "pydensecrf2", "mmsegmentation", "pytest", "opencv-python-headless"} <= set(names)
    assert "timm>=1.0.28,<1.1" in lines  # the line as written, specifiers kept
    for name in ("torch", "torchvision", "triton", "nvidia-cudnn-cu13", "cuda-bindings"):
        assert PREINSTALLED.match(name), name
    for name in ("torchmetrics", "tritonclient", "timm", "opencv-python-headless"):
        assert not PREINSTALLED.match(normalize(name)), name


def test_an_unreachable_package_index_is_named_and_a_reachable_one_is_not(monkeypatch):
    listening = socket.create_server(("127.0.0.1", 0))
    port = listening.getsockname()[1]
    monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{port}/simple")
    assert package_index_error.__wrapped__() is None
    listening.close()
    error = package_index_error.__wrapped__()
    assert error.startswith(f"pip's package index http://127.0.0.1:{port}/simple cannot be reached (")


class RecordingIndex(BaseHTTPRequestHandler):
    """A package index that has nothing and remembers every path asked for."""

    asked: list[str] = []

    def do_GET(self):  # noqa: N802 (the name http.server calls)
        RecordingIndex.asked.append(self.path)
        self.send_error(404)

    def log_message(self, *args):
        pass


@functools.cache
def package_index_error() -> str | None:
    """Why pip's package index cannot be reached, or None: the tests that install from it skip on a machine without a
    network (the lent GPU machine, an offline cluster node), saying so."""
    url = os.environ.get("PIP_INDEX_URL") or subprocess.run(
        [sys.executable, "-m", "pip", "config", "get", "global.index-url"], capture_output=True, text=True
    ).stdout.strip() or "https://pypi.org/simple"
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https"):
        return None
    try:
        socket.create_connection((parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)), 10).close()
    except OSError as err:
        return f"pip's package index {url} cannot be reached ({err}): this test installs from it"
    return None


def needs_package_index() -> None:
    """Skip the calling test where :func:`package_index_error` says why."""
    if error := package_index_error():
        pytest.skip(error)


def link_gpu_stack(into: Path) -> None:
    """Symlinks, in ``into``, to the files of the installed distributions the wheelhouse leaves out (torch,
    torchvision, triton, the CUDA wheels): what a GPU image has before our install."""
    into.mkdir()
    for dist in metadata.distributions():
        if not PREINSTALLED.match(normalize(dist.metadata["Name"])):
            continue
        site = Path(dist.locate_file(""))
        for top in {Path(f).parts[0] for f in dist.files or () if not str(f).startswith("..")}:
            if not (into / top).exists():
                (into / top).symlink_to(site / top)


@pytest.mark.slow
def test_a_wheelhouse_installs_with_no_index_beside_the_installed_torch(tmp_path):
    needs_package_index()
    wheelhouse = tmp_path / "wheelhouse"
    subprocess.run([sys.executable, "tools/wheelhouse.py", str(wheelhouse)], cwd=ROOT, check=True)
    assert not (tmp_path / "wheelhouse.partial").exists()
    names = {normalize(w.name.split("-")[0]) for w in wheelhouse.glob("*.whl")}
    assert {"timm", "pydensecrf2", "mmsegmentation", "albumentations", "pycocotools", "setuptools"} <= names
    assert not {n for n in names if PREINSTALLED.match(n)}
    again = subprocess.run([sys.executable, "tools/wheelhouse.py", str(wheelhouse)], cwd=ROOT, capture_output=True)
    assert again.returncode == 1 and again.stderr.decode().startswith(f"error: {wheelhouse} exists")

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True
    ).stdout.strip()
    link_gpu_stack(tmp_path / "gpu_stack")
    (Path(purelib) / "gpu_stack.pth").write_text(f"{tmp_path / 'gpu_stack'}\n")

    # no pip configuration of this machine, and an index that records what is asked of it: nothing may be
    server = ThreadingHTTPServer(("127.0.0.1", 0), RecordingIndex)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "MAKE"))}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_INDEX_URL=f"http://127.0.0.1:{server.server_port}/simple")
    try:
        install = subprocess.run(
            ["make", "install-offline", f"VENV={venv}", f"WHEELHOUSE={wheelhouse}"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
    finally:
        server.shutdown()
    assert install.returncode == 0, install.stderr
    assert RecordingIndex.asked == []
    probe = (
        "import torch, timm, albumentations, mmseg, pycocotools, pydensecrf.densecrf, pytest, wsss.engine.train; "
        "print(torch.__file__)"
    )
    out = subprocess.run([python, "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert out.startswith(str(tmp_path / "gpu_stack" / "torch"))  # the installed torch, kept
