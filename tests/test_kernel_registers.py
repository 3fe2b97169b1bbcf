"""The Triton kernels compile for an H100 on a machine without one, without spilling (bench/kernel_registers.py).

In a subprocess: this one runs the kernels in Triton's interpreter (``conftest.py``), the compiler needs them built with
``TRITON_INTERPRET=0``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO / "bench", capture_output=True, text=True, timeout=600)


def test_every_kernel_compiles_for_sm90_without_spilling():
    proc = subprocess.run([sys.executable, "bench/kernel_registers.py"], cwd=REPO, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line.split("|") for line in proc.stdout.splitlines() if "(wsss." in line]
    assert [row[1].split(" (")[0].strip() for row in rows] == [
        "energy filter", "PAR affinities", "PAR propagation step", "CRF product", "CRF product", "CRF blur",
        "CRF simplices", "CRF simplices"]  # fmt: skip
    for row in rows:
        assert 0 < int(row[4]) <= 255 and int(row[5]) == 0, row


def test_a_spilling_block_is_reported():
    """The affinity tile at 128 pixels on 4 warps does not fit the registers: the measure sees the spills."""
    proc = run("import json, kernel_registers as k\n"
               "name, kernel, sig, consts, warps = k.kernels()[1]\n"
               "print(json.dumps(k.registers(kernel, sig, {**consts, 'BLOCK': 128}, 4, 90)))")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["registers"] == 255 and result["spill_bytes"] > 0, result
