"""Importing the package and running a tool make no network connection (issue 36: albumentations asked PyPI for its
latest version on every import, which on an offline GPU node printed a failed name lookup per process).

The run is a fresh interpreter whose ``socket`` refuses and records every name lookup and connection before anything
else is imported; ``NO_ALBUMENTATIONS_UPDATE`` is removed from its environment, so the package itself must turn the
update check off.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

GUARDED_RUN = r"""
import socket, sys

attempts = []

def refuse(name, original):
    def call(*args, **kwargs):
        if isinstance(args[0], socket.socket) and args[0].family not in (socket.AF_INET, socket.AF_INET6):
            return original(*args, **kwargs)  # a Unix socket: the data loader's workers
        attempts.append(f"{name}{args}")
        raise OSError(f"no network in this test: {name}")
    return call

for name in ("getaddrinfo", "gethostbyname", "gethostbyname_ex", "create_connection"):
    setattr(socket, name, refuse(name, getattr(socket, name)))
for name in ("connect", "connect_ex"):
    setattr(socket.socket, name, refuse(f"socket.{name}", getattr(socket.socket, name)))

import importlib, pkgutil, runpy
import wsss

for info in pkgutil.walk_packages(wsss.__path__, "wsss."):
    importlib.import_module(info.name)
for tool in sorted(p.stem for p in __import__("pathlib").Path("tools").glob("*.py") if p.stem != "__init__"):
    importlib.import_module(f"tools.{tool}")
data, work = sys.argv[1], sys.argv[2]
for argv in (
    ["tools/make_toy_voc.py", data, "--num-train", "8", "--num-val", "2"],
    ["tools/make_cls_labels.py", data, "--classes", f"{data}/classes.txt", "--mask-dir", "SegmentationClass"],
    ["tools/train.py", "configs/toy_centered.py", "--work-dir", work, "--device", "cpu", "--cfg-options",
     f"data.root={data}", "train.max_iters=2", "train.val_interval=2", "train.ckpt_interval=2", "train.batch_size=4",
     "data.num_workers=1", "data.crop_size=64", "train.log_interval=1"],
):
    sys.argv = argv
    try:
        runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as end:
        if end.code:
            raise
print("ATTEMPTS", attempts)
sys.exit(1 if attempts else 0)
"""


def test_importing_wsss_and_running_the_tools_makes_no_network_connection(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "NO_ALBUMENTATIONS_UPDATE"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    proc = subprocess.run(
        [sys.executable, "-c", GUARDED_RUN, str(tmp_path / "toy"), str(tmp_path / "work")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "ATTEMPTS []" in proc.stdout
    assert (tmp_path / "work" / "iter_2.pth").is_file()  # the tools did run
