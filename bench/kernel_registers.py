"""The project's Triton kernels compiled for an H100 without one: registers and spills per thread.

    python bench/kernel_registers.py [--arch 90]

Compiles each kernel at the shapes the training step launches (``triton.compile`` for ``GPUTarget("cuda", ARCH,
32)``, which needs no GPU), assembles the PTX with the ``ptxas`` bundled in Triton's wheel (``-v --gpu-name
sm_ARCHa``) and prints its register use and spill bytes. Spilled registers go to local memory: on a GPU a kernel
that spills in its inner loop is slower than its arithmetic says. Exits 1 when a kernel does not compile or spills.
tests/test_kernel_registers.py runs it.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"  # compiled kernels, whatever the caller's environment

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from wsss import energy_kernel, par_kernel  # noqa: E402
from wsss.inference.crf import kernels as crf_kernels  # noqa: E402


def kernels() -> list[tuple[str, object, dict[str, str], dict[str, int], int]]:
    """``(name, kernel, signature, constexprs, num_warps)`` as the training step and the dense CRF launch them: the
    energy's 21 classes (K padded to 32, two halves), PAR's 48 neighbours and up to 16 channels per program, the CRF's
    products at 21 classes (the blurs' tile) and 81 (the last slice's softmax over a 128-wide row), its simplices of
    the Gaussian kernel's 2-d and the bilateral's 5-d features."""
    e, p, c = energy_kernel, par_kernel, crf_kernels
    energy = {"feat_ptr": "*fp32", "val_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "D": "constexpr",
              "K2": "constexpr", "BLOCK_ROWS": "constexpr", "BLOCK_COLS": "constexpr"}  # fmt: skip
    affinity = {"image_ptr": "*fp32", "dy_ptr": "*i32", "dx_ptr": "*i32", "position_ptr": "*fp32", "out_ptr": "*fp32",
                "height": "i32", "width": "i32", "w1": "fp32", "eps": "fp32", "K": "constexpr", "KP": "constexpr",
                "BLOCK": "constexpr"}  # fmt: skip
    propagate = {"masks_ptr": "*fp32", "affinity_ptr": "*fp32", "dy_ptr": "*i32", "dx_ptr": "*i32", "out_ptr": "*fp32",
                 "height": "i32", "width": "i32", "channels": "i32", "K": "constexpr", "BLOCK": "constexpr",
                 "BLOCK_CHANNELS": "constexpr"}  # fmt: skip
    product = {"crow_ptr": "*i32", "col_ptr": "*i32", "val_ptr": "*fp32", "x_ptr": "*fp32", "base_ptr": "*fp32",
               "out_ptr": "*fp32", "rows": "i32", "channels": "i32", "HAS_BASE": "constexpr", "SOFTMAX": "constexpr",
               "BLOCK_ROWS": "constexpr", "BLOCK_CHANNELS": "constexpr"}  # fmt: skip
    crf = [dict(zip(("BLOCK_ROWS", "BLOCK_CHANNELS"), c.blocks(classes, softmax), strict=True)) | {"SOFTMAX": softmax}
           for classes, softmax in ((21, False), (81, True))]  # fmt: skip
    blur = {"neighbour_ptr": "*i32", "second": "i32", "x_ptr": "*fp32", "out_ptr": "*fp32", "rows": "i32",
            "channels": "i32", "BLOCK_ROWS": "constexpr", "BLOCK_CHANNELS": "constexpr"}  # fmt: skip
    simplex = {"features_ptr": "*fp32", "scale_ptr": "*fp32", "rem0_ptr": "*i64", "rank_ptr": "*i64",
               "weight_ptr": "*fp32", "n": "i32", "down": "fp32", "D": "constexpr", "DP": "constexpr",
               "BLOCK": "constexpr"}  # fmt: skip
    dims = [{"D": d, "DP": triton.next_power_of_2(d + 1), "BLOCK": c.SIMPLEX_TILE // triton.next_power_of_2(d + 1) ** 2}
            for d in (2, 5)]  # fmt: skip
    return [
        ("energy filter (wsss.energy_kernel)", e._gaussian_filter_kernel, energy,
         {"D": 5, "K2": 64, "BLOCK_ROWS": e.BLOCK_ROWS, "BLOCK_COLS": e.BLOCK_COLS}, e.NUM_WARPS),
        ("PAR affinities (wsss.par_kernel)", p._affinity_kernel, affinity,
         {"K": 48, "KP": 64, "BLOCK": p.AFFINITY_BLOCK}, p.AFFINITY_WARPS),
        ("PAR propagation step (wsss.par_kernel)", p._propagate_kernel, propagate,
         {"K": 48, "BLOCK": p.BLOCK, "BLOCK_CHANNELS": p.BLOCK_CHANNELS}, p.NUM_WARPS),
        *[("CRF product (wsss.inference.crf.kernels)", c._product_kernel, product, {"HAS_BASE": True, **blocks},
           c.NUM_WARPS) for blocks in crf],
        ("CRF blur (wsss.inference.crf.kernels)", c._blur_kernel, blur,
         dict(zip(("BLOCK_ROWS", "BLOCK_CHANNELS"), c.blocks(21, False), strict=True)), c.NUM_WARPS),
        *[("CRF simplices (wsss.inference.crf.kernels)", c._simplex_kernel, simplex, constants, c.NUM_WARPS)
          for constants in dims],
    ]  # fmt: skip


def ptxas() -> Path:
    """Triton's bundled ``ptxas``."""
    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no ptxas in this Triton install; reinstall triton from its wheel")
    return path


def registers(kernel, signature: dict[str, str], constexprs: dict[str, int], num_warps: int, arch: int) -> dict:
    """``{"registers": ..., "spill_bytes": ...}`` of one compiled kernel (stores and loads of spilled registers)."""
    compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs),
                              target=GPUTarget("cuda", arch, 32), options={"num_warps": num_warps})  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        ptx = Path(tmp) / "kernel.ptx"
        ptx.write_text(compiled.asm["ptx"])
        args = [str(ptxas()), "-v", "--gpu-name", f"sm_{arch}a", str(ptx), "-o", str(Path(tmp) / "kernel.cubin")]
        log = subprocess.run(args, capture_output=True, text=True, check=True).stderr
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    return {"registers": int(re.search(r"Used (\d+) registers", log).group(1)),
            "spill_bytes": int(spills.group(1)) + int(spills.group(2))}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", type=int, default=90, help="compute capability x 10 (90: H100)")
    args = parser.parse_args(argv)
    print(f"| kernel (sm_{args.arch}a) | constants | warps | registers per thread | spill bytes |")
    print("|---|---|---:|---:|---:|")
    spilled = False
    for name, kernel, signature, constexprs, warps in kernels():
        r = registers(kernel, signature, constexprs, warps, args.arch)
        spilled |= r["spill_bytes"] > 0
        consts = ", ".join(f"{k}={v}" for k, v in constexprs.items())
        print(f"| {name} | {consts} | {warps} | {r['registers']} | {r['spill_bytes']} |", flush=True)
    return 1 if spilled else 0


if __name__ == "__main__":
    sys.exit(main())
