"""bench/bench_inference.py --profile: the loop's own thread profiled on its CPU clock, per image (docs/benchmarks.md,
"Where the loop's time goes": where a GPU's loop spends the host's time)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import bench_inference  # noqa: E402


def test_the_loop_s_thread_is_profiled_per_image(capsys, monkeypatch):
    """4 images in batches of 2: each image's files queued once (``_finish``: 1 call per image), each batch run once
    (``_run_batch``: 0.5); the table lists every function (``--profile`` larger than their number), and their own
    times add up to the thread's total."""
    monkeypatch.chdir(REPO)
    argv = ["--configs", "configs/toy_centered.py", "--num", "4", "--size", "64", "48", "--batch-size", "2", "--rows",
            "loop alone", "--modes", "single", "--max-workers", "0", "--threads", "1", "--profile", "9999"]  # fmt: skip
    assert bench_inference.main(argv) == 0
    out = capsys.readouterr().out
    head = re.search(r"toy_centered.py single loop alone, profiled: the loop's thread ([\d.]+) CPU ms per image in "
                     r"all, the wall ([\d.]+) ms per image\n", out)  # fmt: skip
    assert head, out
    rows = re.findall(r"^\| `(.+)` \| ([\d.]+) \| ([\d.]+) \| (\d+)% \|$", out, flags=re.MULTILINE)
    calls = {re.sub(r":\d+\(", "(", name): float(per_image) for name, per_image, _, _ in rows}
    assert calls["loop.py(_run_batch)"] == 0.5 and calls["loop.py(_finish)"] == 1.0, calls
    rounding = 0.0005 * len(rows) + 0.005  # each row's 3 decimals, the total's 2
    assert sum(float(own) for _, _, own, _ in rows) == pytest.approx(float(head[1]), abs=rounding)
