"""bench/bench_crf.py --traffic: the CRF's memory-bandwidth bound from the lattices photographs make, and its rows
(docs/benchmarks.md, "The CRF's traffic bound")."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import bench_crf  # noqa: E402


def test_the_traffic_bound_counts_each_product_once():
    """One iteration over 10 pixels, 3 classes, a 2-d lattice of 7 points and a 5-d one of 4, product by product."""
    n, c = 10, 3
    want = 0
    for m, d in ((7, 2), (4, 5)):
        splat = n * c * 4 + n * (d + 1) * 8 + (m + 1) * 4 + m * c * 4  # the marginals, the matrix, the values
        blurs = (d + 1) * (m * c * 4 + 2 * m * 4 + m * c * 4)  # the values read, the neighbours, the values written
        slice_ = m * c * 4 + n * (d + 1) * 8 + (n + 1) * 4  # the values, the matrix
        want += splat + blurs + slice_
    base_and_out = 2 * n * c * 4
    assert bench_crf.iteration_traffic(n, [(7, 2), (4, 5)], c) == want + base_and_out
    assert bench_crf.iteration_traffic(n, [(7, 2), (4, 5)], c, paired=False) == want + 2 * base_and_out
    half = bench_crf.iteration_traffic(n, [(7, 2), (4, 5)], c, half=(2,))
    assert half == want + base_and_out - (2 * 3 + 2) * 7 * c * 2  # the 2-d lattice's values at 2 bytes
    # 2 directions per blur launch: the 2-d lattice's 3 in 2 launches, the 5-d one's 6 in 3; 3 directions: 1 and 2
    for directions, launches in ((2, {2: 2, 5: 3}), (3, {2: 1, 5: 2})):
        saved = sum((d + 1 - launches[d]) * 2 * m * c * 4 for m, d in ((7, 2), (4, 5)))  # values read and written
        assert bench_crf.iteration_traffic(n, [(7, 2), (4, 5)], c, directions=directions) == want + base_and_out - saved


def test_the_blur_gathers_count_three_rows_per_direction_nested():
    """A 2-d lattice of 7 points (3 directions) and a 5-d one of 4 (6), 3 classes, 2 iterations: 3 rows gathered per
    point and direction in launches of one, 9 per point in a launch of two, 27 in one of three."""
    sizes, c = [(10, 7, 2), (10, 4, 5)], 3
    per_row = c * 4 * 2
    assert bench_crf.blur_gathers(sizes, c, 2) == (3 * 3 * 7 + 6 * 3 * 4) * per_row
    assert bench_crf.blur_gathers(sizes, c, 2, directions=2) == ((9 + 3) * 7 + 3 * 9 * 4) * per_row
    assert bench_crf.blur_gathers(sizes, c, 2, directions=3) == (27 * 7 + 2 * 27 * 4) * per_row


def test_the_traffic_table_reads_the_lattices_a_call_builds():
    pytest.importorskip("skimage")  # its photographs (a dev requirement)
    pytest.importorskip("pydensecrf.densecrf", reason="pydensecrf2 (the CRF oracle) is a dev requirement")
    image, probs = bench_crf.photographs((48, 64), 1)[0], bench_crf.probabilities((48, 64), 3, 0)
    sizes = bench_crf.lattice_sizes(bench_crf.CrfConfig(), image, probs)
    assert [d for _, _, d in sizes] == [2, 5] and all(n == 48 * 64 for n, _, _ in sizes)
    assert all(0 < m < n * (d + 1) for n, m, d in sizes)
    proc = subprocess.run([sys.executable, "bench/bench_crf.py", "--traffic", "--images", "1", "--cases", "voc21"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {row[1]: row for row in ([cell.strip() for cell in line.split("|")[1:-1]]
                                    for line in proc.stdout.splitlines() if line.startswith("| voc21 |"))}  # fmt: skip
    assert list(rows) == list(bench_crf.VARIANTS), proc.stdout
    for name, (_, _, points, mb, ms, rate, goal, share, gathers, off, equal) in rows.items():
        assert re.fullmatch(r"[\d.]+-[\d.]+, [\d.]+-[\d.]+", points)
        assert float(ms) == pytest.approx(float(mb) * 1e6 / bench_crf.HBM * 1000, rel=0.01)
        assert float(rate) == pytest.approx(1000 / float(ms), rel=0.01) and goal == "500"
        assert float(share) == pytest.approx(500 * float(ms) / 1000, abs=0.01)
        if name == "float32":  # the kernels' own sums (and those of more directions a launch): pydensecrf's marginals
            assert float(off) < 1e-5 and float(equal) == 100.0
        assert float(gathers) > 0
    mb = {name: float(row[3]) for name, row in rows.items()}
    order = ["float32, the slices apart (before)", "float32", "float16, Gaussian lattice", "float16, both lattices"]
    assert [mb[name] for name in order] == sorted(mb[name] for name in order)[::-1], mb
    nested = ["float32", "float32, 2 directions per blur", "float32, 3 directions per blur"]
    assert [mb[name] for name in nested] == sorted(mb[name] for name in nested)[::-1], mb  # more directions: less
    gathered = [float(rows[name][8]) for name in nested]  # traffic, more rows gathered
    assert gathered == sorted(gathered), gathered
    assert float(rows["float16, both lattices"][9]) > 1e-4  # the rounding shows in the marginals


def test_a_profiled_call_splits_the_construction_from_the_mean_field(capsys):
    """``--profile``: the construction's operators (a call of 0 iterations) are a part of the whole call's, whose
    mean-field adds its iterations' products; each table sums its rows against the call's wall time (on a CPU the
    operators' own times, near all of it)."""
    import torch

    pytest.importorskip("skimage")  # its photographs (a dev requirement)
    image, probs = bench_crf.photographs((24, 32), 1)[0], bench_crf.probabilities((24, 32), 3, 0)
    cfg = bench_crf.CrfConfig(iterations=3, kernel="torch")
    bench_crf.profile_call("a case", [image], [torch.from_numpy(probs)], cfg, 3, torch.device("cpu"))
    heads = [line for line in capsys.readouterr().out.splitlines() if line.startswith("a case: ")]
    found = [re.fullmatch(r"a case: (.+): (\d+) operators \(a CPU's: their own time\), ([\d.]+) ms summed, (\d+)% of "
                          r"its wall ([\d.]+) ms", line) for line in heads]  # fmt: skip
    assert [m and m[1] for m in found] == ["construction (0 iterations)", "whole call (3 iterations)"], heads
    (_, built, _, built_share, _), (_, whole, _, whole_share, _) = (m.groups() for m in found)
    assert 0 < int(built) < int(whole) and int(built_share) > 0 and int(whole_share) > 0


def test_the_cuda_table_profiles_each_case_at_its_largest_batch(capsys, monkeypatch):
    """The CUDA table's code on the CPU, two small cases at batches of 1 and 2, two kernel choices and two memory
    budgets: a row per case, batch, kernel choice and budget, then each case's profiles, at the batch of 2 only, before
    the next case's rows under their own header."""
    import argparse

    pytest.importorskip("skimage")  # its photographs (a dev requirement)
    monkeypatch.setattr(bench_crf, "CASES", {"three": ((24, 32), 3), "five": ((24, 32), 5)})
    args = argparse.Namespace(cases=["three", "five"], cuda_batches=[1, 2], cuda_kernels=["auto", "torch"],
                              cuda_blur_directions=[1], cuda_memory_mib=[64, 128], profile=2)  # fmt: skip
    bench_crf.cuda_table(args, bench_crf.CrfConfig(iterations=2), "cpu")
    shown = []
    for line in capsys.readouterr().out.splitlines():
        cells = [cell.strip() for cell in line.split("|")[1:-1]]
        if cells[:1] == ["case"]:
            shown.append("header")
        elif cells[:1] in (["three"], ["five"]):
            shown.append(f"{cells[0]} {cells[1]} {cells[2]} {cells[4]}")
        elif line.startswith(("three,", "five,")):
            shown.append(line.split(": ")[0] + ": " + line.split(": ")[1].split(" ")[0])

    def rows(case: str) -> list[str]:
        choices = [(kernel, mib) for kernel in ("auto", "torch") for mib in (64, 128)]
        profiles = [f"{case}, batch 2, {kernel}, memory_mib {mib}: {part}" for kernel, mib in choices
                    for part in ("construction", "whole")]  # fmt: skip
        return ["header", *(f"{case} {batch} {kernel} {mib}" for batch in (1, 2) for kernel, mib in choices), *profiles]

    assert shown == rows("three") + rows("five"), shown
