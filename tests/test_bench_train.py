"""bench/_common.py's kernel table (bench_train.py --kernels, bench_crf.py --profile): a call's kernels (a CPU's
operators) from one profiled call, counted and summed, the longest first (docs/benchmarks.md, "On an H200": why a
stage is far above its bound)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import _common  # noqa: E402


def test_a_stage_s_operators_are_counted_summed_and_ranked(capsys):
    a, b = torch.randn(384, 384), torch.randn(384, 384)

    def stage() -> torch.Tensor:
        return (a @ b @ b @ b).relu_() + 1.0

    rows = _common.kernel_times(stage, torch.device("cpu"))
    calls = {name: count for name, count, _ in rows}
    assert calls["aten::mm"] == 3 and calls["aten::relu_"] == 1 and calls["aten::add"] == 1
    assert rows[0][0] == "aten::mm" and [r[2] for r in rows] == sorted((r[2] for r in rows), reverse=True)
    busy = sum(seconds for _, _, seconds in rows)
    _common.print_kernels("a stage", rows, 2, False, 2 * busy, "its graph's")
    lines = capsys.readouterr().out.splitlines()
    total = sum(count for _, count, _ in rows)
    assert lines[1] == (f"a stage: {total} operators (a CPU's: their own time), {busy * 1e3:.2f} ms summed, 50% of its "
                        f"graph's {2 * busy * 1e3:.2f} ms")  # fmt: skip
    assert len([line for line in lines if line.startswith("| `")]) == 2 and lines[4].startswith("| `aten::mm` | 3 |")
