"""The project's Triton kernels compiled for an H100 without one: registers, spills and occupancy per kernel.

    python bench/kernel_registers.py [--arch 90]

Compiles each kernel at the shapes the training step launches (``triton.compile`` for ``GPUTarget("cuda", ARCH,
32)``, which needs no GPU), assembles the PTX with the ``ptxas`` bundled in Triton's wheel (``-v --gpu-name
sm_ARCHa``) and prints its register use, spill bytes, shared memory, the warps an SM can hold at once (occupancy:
what the SM has to hide the latency of one warp's loads, ``exp2`` and tensor-core waits behind the others'
arithmetic) and whether ptxas serialises its ``wgmma`` (warning C7515: each waits for the one before). Spilled
registers go to local memory: on a GPU a kernel that spills in its inner loop is slower than its arithmetic says.
The energy kernel is compiled in each configuration its autotuner may pick (``wsss.energy_kernel.TUNED_BLOCKS``).
Exits 1 when a kernel does not compile or spills. tests/test_kernel_registers.py runs it.
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


def kernels() -> list[tuple[str, object, dict[str, str], dict[str, int], dict[str, int]]]:
    """``(name, kernel, signature, constexprs, options)`` as the training step and the dense CRF launch them (options:
    ``num_warps``, and ``num_stages`` and ``maxnreg`` where the launch sets them): the energy's 21 classes (K padded to
    32, two halves) at its default blocks and in each of its autotuner's configurations, PAR's 48 neighbours and up to
    16 channels per program, the CRF's splat at 21 classes (the blurs' tile) and its two slices in one launch at 21 and
    81 classes (the softmax over a 32- and a 128-wide row), the pseudo-label export's three stacks of 4 and 21 classes
    (a softmax per stack), its blur of one direction (with and without a count of live rows) and of two and three in
    one launch, its simplices of the Gaussian kernel's 2-d and the bilateral's 5-d features."""
    e, p, c = energy_kernel, par_kernel, crf_kernels
    energy = {"feat_ptr": "*fp32", "val_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "D": "constexpr",
              "K2": "constexpr", "BLOCK_ROWS": "constexpr", "BLOCK_COLS": "constexpr"}  # fmt: skip
    affinity = {"image_ptr": "*fp32", "dy_ptr": "*i32", "dx_ptr": "*i32", "position_ptr": "*fp32", "out_ptr": "*fp32",
                "height": "i32", "width": "i32", "w1": "fp32", "eps": "fp32", "K": "constexpr", "KP": "constexpr",
                "BLOCK": "constexpr"}  # fmt: skip
    propagate = {"masks_ptr": "*fp32", "affinity_ptr": "*fp32", "dy_ptr": "*i32", "dx_ptr": "*i32", "out_ptr": "*fp32",
                 "height": "i32", "width": "i32", "channels": "i32", "K": "constexpr", "BLOCK": "constexpr",
                 "BLOCK_CHANNELS": "constexpr"}  # fmt: skip
    product = {"crow_ptr": "*i32", "col_ptr": "*i32", "val_ptr": "*fp32", "x_ptr": "*fp32", "crow2_ptr": "*i32",
               "col2_ptr": "*i32", "val2_ptr": "*fp32", "x2_ptr": "*fp32", "base_ptr": "*fp32", "out_ptr": "*fp32",
               "live_ptr": "*i64", "rows": "i32", "channels": "i32", "HAS_BASE": "constexpr",
               "HAS_SECOND": "constexpr", "HAS_LIVE": "constexpr", "SOFTMAX": "constexpr", "GROUPS": "constexpr",
               "BLOCK_ROWS": "constexpr", "BLOCK_CHANNELS": "constexpr"}  # fmt: skip
    # the CRF's splat at 21 classes, its two slices in one (the prior, a softmax of 21 or 81 classes or of stacks),
    # and the energy lattice's splat (its live rows)
    crf = [dict(zip(("BLOCK_ROWS", "BLOCK_CHANNELS"), c.blocks(channels, softmax), strict=True))
           | {"SOFTMAX": softmax, "GROUPS": groups, "HAS_BASE": softmax, "HAS_SECOND": softmax, "HAS_LIVE": live}
           for channels, softmax, groups, live in ((21, False, 1, False), (21, True, 1, False), (81, True, 1, False),
                                                   (12, True, 3, False), (63, True, 3, False),
                                                   (21, False, 1, True))]  # fmt: skip
    blur = {"neighbour_ptr": "*i32", "second": "i32", "step": "i32", "x_ptr": "*fp32", "out_ptr": "*fp32",
            "live_ptr": "*i64", "rows": "i32", "channels": "i32", "DIRECTIONS": "constexpr", "HAS_LIVE": "constexpr",
            "BLOCK_ROWS": "constexpr", "BLOCK_CHANNELS": "constexpr"}  # fmt: skip
    simplex = {"features_ptr": "*fp32", "scale_ptr": "*fp32", "rem0_ptr": "*i64", "rank_ptr": "*i64",
               "weight_ptr": "*fp32", "n": "i32", "down": "fp32", "D": "constexpr", "DP": "constexpr",
               "BLOCK": "constexpr"}  # fmt: skip
    dims = [{"D": d, "DP": triton.next_power_of_2(d + 1), "BLOCK": c.SIMPLEX_TILE // triton.next_power_of_2(d + 1) ** 2}
            for d in (2, 5)]  # fmt: skip
    # The autotuner's own configurations, with the options its launches compile with (num_ctas is always 1).
    tuned = [(cfg.kwargs, {k: v for k, v in cfg.all_kwargs().items() if k not in cfg.kwargs and k != "num_ctas"})
             for cfg in e._tuned().configs]  # fmt: skip
    crf_warps = {"num_warps": c.NUM_WARPS}
    return [
        ("energy filter (wsss.energy_kernel)", e._gaussian_filter_kernel, energy,
         {"D": 5, "K2": 64, "BLOCK_ROWS": e.BLOCK_ROWS, "BLOCK_COLS": e.BLOCK_COLS}, {"num_warps": e.NUM_WARPS}),
        *[("energy filter, autotuned (wsss.energy_kernel)", e._gaussian_filter_kernel, energy,
           {"D": 5, "K2": 64, **blocks}, options) for blocks, options in tuned],
        ("PAR affinities (wsss.par_kernel)", p._affinity_kernel, affinity,
         {"K": 48, "KP": 64, "BLOCK": p.AFFINITY_BLOCK}, {"num_warps": p.AFFINITY_WARPS}),
        ("PAR propagation step (wsss.par_kernel)", p._propagate_kernel, propagate,
         {"K": 48, "BLOCK": p.BLOCK, "BLOCK_CHANNELS": p.BLOCK_CHANNELS}, {"num_warps": p.NUM_WARPS}),
        *[("CRF product (wsss.inference.crf.kernels)", c._product_kernel, product, blocks, crf_warps)
          for blocks in crf],
        *[("CRF blur (wsss.inference.crf.kernels)", c._blur_kernel, blur,
           dict(zip(("BLOCK_ROWS", "BLOCK_CHANNELS"), c.blocks(21, False, directions), strict=True))
           | {"HAS_LIVE": live, "DIRECTIONS": directions}, crf_warps)
          for live, directions in ((False, 1), (True, 1), (False, 2), (False, 3))],
        *[("CRF simplices (wsss.inference.crf.kernels)", c._simplex_kernel, simplex, constants, crf_warps)
          for constants in dims],
    ]  # fmt: skip


def ptxas() -> Path:
    """Triton's bundled ``ptxas``."""
    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no ptxas in this Triton install; reinstall triton from its wheel")
    return path


def warps_per_sm(registers: int, shared_bytes: int, num_warps: int) -> int:
    """The warps of one kernel an SM of compute capability 9.0 holds at once: its 64 K registers, allocated per warp in
    units of 256 (8 per thread), its 228 KiB of shared memory, of which each program reserves 1 KiB more, 64 warps
    and 32 programs (CUDA C++ Programming Guide, table of the technical specifications per compute capability)."""
    per_program = -(-registers // 8) * 8 * 32 * num_warps
    programs = min(65536 // per_program, 228 * 1024 // (shared_bytes + 1024), 64 // num_warps, 32)
    return programs * num_warps


def registers(kernel, signature: dict[str, str], constexprs: dict[str, int], options: dict[str, int],
              arch: int) -> dict:  # fmt: skip
    """``{"registers", "spill_bytes", "shared_bytes", "warps_per_sm", "wgmma_serialised"}`` of one compiled kernel
    (spill bytes: stores and loads of spilled registers; warps per SM: :func:`warps_per_sm`; wgmma serialised: ptxas's
    C7515, None for a kernel without ``wgmma``)."""
    compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs),
                              target=GPUTarget("cuda", arch, 32), options=options)  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        ptx = Path(tmp) / "kernel.ptx"
        ptx.write_text(compiled.asm["ptx"])
        args = [str(ptxas()), "-v", "--gpu-name", f"sm_{arch}a", str(ptx), "-o", str(Path(tmp) / "kernel.cubin")]
        log = subprocess.run(args, capture_output=True, text=True, check=True).stderr
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    used = int(re.search(r"Used (\d+) registers", log).group(1))
    return {"registers": used, "spill_bytes": int(spills.group(1)) + int(spills.group(2)),
            "shared_bytes": compiled.metadata.shared,
            "warps_per_sm": warps_per_sm(used, compiled.metadata.shared, options["num_warps"]),
            "wgmma_serialised": "C7515" in log if "wgmma" in compiled.asm["ptx"] else None}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", type=int, default=90, help="compute capability x 10 (90: H100)")
    args = parser.parse_args(argv)
    print(f"| kernel (sm_{args.arch}a) | constants | options | registers per thread | spill bytes | shared KiB "
          "| warps per SM | wgmma serialised |")  # fmt: skip
    print("|---|---|---|---:|---:|---:|---:|---|")
    spilled = False
    for name, kernel, signature, constexprs, options in kernels():
        r = registers(kernel, signature, constexprs, options, args.arch)
        spilled |= r["spill_bytes"] > 0
        consts = ", ".join(f"{k}={v}" for k, v in constexprs.items())
        opts = ", ".join(f"{k.removeprefix('num_')}={v}" for k, v in options.items())
        serial = {None: "-", True: "yes", False: "no"}[r["wgmma_serialised"]]
        print(f"| {name} | {consts} | {opts} | {r['registers']} | {r['spill_bytes']} | {r['shared_bytes'] / 1024:.1f} "
              f"| {r['warps_per_sm']} | {serial} |", flush=True)  # fmt: skip
    return 1 if spilled else 0


if __name__ == "__main__":
    sys.exit(main())
