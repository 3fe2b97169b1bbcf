"""SIGTERM ends tools/infer.py within seconds on large images, leaving every finished image whole and nothing
half-written."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from PIL import Image

from wsss.utils.fileio import read_mask

pytestmark = pytest.mark.slow

SLOW_INFER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from wsss.models.segmentor import WSSSModel
    from wsss.utils.lifetime import exit_on_sigterm
    from tools import infer

    calls, forward = Path(sys.argv[1]), WSSSModel.forward

    def slow_forward(self, x):  # count the forward passes (one per scale), then a delay after each
        calls.write_text(str(int(calls.read_text() or 0) + 1))
        out = forward(self, x)
        time.sleep(0.3)
        return out

    WSSSModel.forward = slow_forward
    exit_on_sigterm()
    raise SystemExit(infer.main(sys.argv[2:]))
""")


def test_sigterm_ends_inference_of_large_images_within_seconds(toy_checkpoint, tmp_path):
    root, ckpt = toy_checkpoint
    inp, out, calls = tmp_path / "in", tmp_path / "out", tmp_path / "calls"
    inp.mkdir()
    calls.write_text("")
    with Image.open(root / "JPEGImages" / "val_00000.jpg") as image:
        large = image.resize((3000, 2000))  # without a size cap, one forward pass of the tiny ViT takes minutes
    for name in ("a", "b", "c"):
        large.save(inp / f"{name}.jpg", quality=90)
    argv = [str(ckpt), str(inp), str(out), "--scales", "1.0", "0.5", "--no-flip", "--no-progress", "--threads", "1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", SLOW_INFER, str(calls), *argv], env=env, cwd=Path.cwd(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 14
        while int(calls.read_text() or 0) < 3 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)  # until the second image's first scale runs
        started = int(calls.read_text() or 0)
        proc.send_signal(signal.SIGTERM)
        tic = time.monotonic()
        try:
            rc = proc.wait(timeout=4)
        except subprocess.TimeoutExpired:
            rc = None
        seconds = time.monotonic() - tic
    finally:
        proc.kill()
        _, err = proc.communicate()
    assert started >= 3, f"the second image did not start within 14 s ({started} forward passes): {err[-2000:]}"
    assert rc == 128 + signal.SIGTERM, f"still running {seconds:.1f} s after SIGTERM (rc {rc}): {err[-2000:]}"
    masks = sorted(p.name for p in (out / "masks").iterdir())
    assert masks and "c.png" not in masks
    for name in masks:  # every finished image whole: its mask decodes at full size, its labels parse
        assert read_mask(out / "masks" / name).shape == (2000, 3000)
        assert json.loads((out / "labels" / name.replace(".png", ".json")).read_text())["classes"]
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]  # nothing half-written left behind
