"""Check this project on a real GPU and write one report (``make gpu-check``).

    python tools/gpu_check.py [CONFIG] [--out DIR] [--parts device bench ddp] [--cfg-options k=v ...] [--driver-only]

Parts (wsss/gpu_check.py): ``device`` compares CUDA with timm, the CPU and brute force; ``bench`` runs
bench/bench_train.py at the paper setting (CAM pass bf16 and float32); ``ddp`` trains 1 process under torchrun
with NCCL and checks that a resumed run is bit-identical. No pretrained weights, no network. Writes
OUT/gpu_check.md and OUT/gpu_check.json (after every part). Exit 0: every check passed; 1: a check failed;
2: no CUDA device (refused before torch is imported where no NVIDIA driver is visible), or a bad argument.
"""

from __future__ import annotations

import argparse
import sys

from wsss.utils.startup import add_threads_argument, apply_threads, input_error, nvidia_driver_error, refuse

PARTS = ("device", "bench", "ddp")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs="?", default="configs/voc_centered.py", help="the paper's config (default)")
    parser.add_argument("--out", default="work_dirs/gpu_check", help="report folder")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--cfg-options", nargs="+", metavar="KEY=VALUE", help="override config values")
    parser.add_argument(
        "--driver-only", action="store_true",
        help="only check that an NVIDIA driver is visible (standard library only: make gpu-check runs it first)",
    )  # fmt: skip
    add_threads_argument(parser)
    args = parser.parse_args(argv)

    # usage errors, no driver and missing files come at once, before torch is imported
    if error := nvidia_driver_error():
        return refuse(error)
    if args.driver_only:
        return 0
    if error := input_error({"config": args.config}):
        return refuse(error)
    from wsss.config import ConfigError, load_config, parse_cfg_options

    try:
        cfg = load_config(args.config, {**parse_cfg_options(args.cfg_options), "model.pretrained": ""})
    except (OSError, ValueError) as err:  # ConfigError is a ValueError
        return refuse(str(err))
    apply_threads(args.threads, cfg.data.num_workers)
    from wsss.gpu_check import NoCudaError, gpu_check

    try:
        report = gpu_check(args.config, cfg, args.out, tuple(args.parts))
    except (ConfigError, FileNotFoundError, NoCudaError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    failed = [c.name for c in report.checks if not c.passed] + report.failures
    print(f"report: {args.out}/gpu_check.md and gpu_check.json; " + ("all checks passed" if not failed else
          f"{len(failed)} failed: {'; '.join(failed)}"))  # fmt: skip
    return 0 if not failed else 1


if __name__ == "__main__":
    raise SystemExit(main())
