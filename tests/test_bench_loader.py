"""bench/bench_loader.py on a small set: a row per worker count with the loader now and as it was, the iterations/s it
feeds, and the workers the goal needs (docs/benchmarks.md, "The training loader alone")."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_the_loader_bench_times_the_loader_now_and_before_per_worker_count():
    pytest.importorskip("skimage")  # its photographs (a dev requirement)
    argv = ["--cfg-options", "data.crop_size=64", "train.batch_size=2", "--images", "4", "--batches", "2",
            "--workers", "0", "1", "--goal", "100"]  # fmt: skip
    proc = subprocess.run([sys.executable, "bench/bench_loader.py", *argv], cwd=REPO, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [[cell.strip() for cell in line.split("|")[1:-1]] for line in proc.stdout.splitlines()
            if re.match(r"\| \d+ \|", line)]  # fmt: skip
    assert [row[0] for row in rows] == ["0", "1"], proc.stdout
    for _, uint8, restarted, float32, ratio, fed, goal in rows:
        assert float(uint8) > 0 and float(restarted) > 0 and float(float32) > 0 and goal == "100"
        assert float(ratio) == pytest.approx(float(uint8) / float(float32), abs=0.01)
        assert float(fed) == pytest.approx(float(uint8) / 2, abs=0.1)  # at the batch of 2
    need = re.search(r"100 it/s at batch 2 needs 200 images/s: (\d+) worker\(s\)", proc.stdout)
    rate = float(rows[1][1])  # one worker's, printed to 0.1: either side of its rounding
    assert need and int(need[1]) in {math.ceil(200 / (rate + 0.05)), math.ceil(200 / (rate - 0.05))}, proc.stdout
