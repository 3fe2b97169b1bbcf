"""Whether Triton's CPU interpreter can run this project's kernels here: without a GPU the kernel tests run in it
(``TRITON_INTERPRET=1``, tests/conftest.py), and some Triton and numpy versions cannot. Each kernel test is marked
:data:`needs_kernel`, which skips it there saying why; on a GPU the compiled kernels are another path."""

from __future__ import annotations

import numpy as np
import pytest
import torch

triton = pytest.importorskip("triton")

import triton.language as tl  # noqa: E402


@triton.jit
def _runtime_bound_probe(out_ptr, n):
    """Counts to ``n`` in a loop whose bound is a runtime argument, as the energy kernel's column loop does."""
    count = tl.zeros((1,), dtype=tl.int32)
    for _ in range(0, n, 1):
        count += 1
    tl.store(out_ptr + tl.arange(0, 1), count)


def interpreter_cannot_run_the_kernels() -> str | None:
    """Why Triton's CPU interpreter cannot run the kernels here, or None. Triton 3.6's cannot loop to a runtime
    bound under numpy >= 2.4 (``int()`` of a 1-element array, triton-lang/triton#9171; with torch 2.11's triton 3.6 on
    2026-11-28, 36 tests of the energy lattice's and the CRF's kernels failed on it); the stores of Triton 3.0 and
    3.1's do not reach CPU tensors under any numpy (3.2 is the first whose do). The compiled kernels are another
    path."""
    out = torch.zeros(1, dtype=torch.int32)
    try:
        _runtime_bound_probe[(1,)](out, 3)
    except triton.runtime.errors.InterpreterError:
        return (
            f"the CPU interpreter of Triton {triton.__version__} cannot loop to a runtime bound under numpy "
            f"{np.__version__} (triton-lang/triton#9171): install numpy<2.4 or a newer triton to run the kernels here"
        )
    if out.item() != 3:
        return (
            f"the stores of Triton {triton.__version__}'s CPU interpreter do not reach CPU tensors (a probe counting "
            f"to 3 left {out.item()}): install triton >= 3.2 (torch >= 2.6) to run the kernels here"
        )
    return None


INTERPRETER_PROBLEM = interpreter_cannot_run_the_kernels() if not torch.cuda.is_available() else None
needs_kernel = pytest.mark.skipif(INTERPRETER_PROBLEM is not None, reason=str(INTERPRETER_PROBLEM))
"""Mark a test that runs a Triton kernel: on a CPU whose interpreter cannot, it skips naming the reason."""
