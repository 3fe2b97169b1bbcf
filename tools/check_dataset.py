"""Check a dataset before training: every image and mask decodes, sizes and values fit, the label file is sound.

    python tools/check_dataset.py CONFIG [--cfg-options k=v ...]

Lists every problem (file and reason) and exits 1 if there is one, 0 if the dataset is sound. The same
check runs at training start with ``--cfg-options data.check_images=True``.
"""

from __future__ import annotations

import argparse
import sys

from wsss.config import load_config, parse_cfg_options
from wsss.utils.startup import input_error, refuse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="config file whose data section describes the dataset")
    parser.add_argument("--cfg-options", nargs="+", metavar="KEY=VALUE", help="override config values")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)

    # --help, usage errors and missing files come at once, before torch is imported
    if error := input_error({"config": args.config}):
        return refuse(error)
    from wsss.data.check import check_dataset

    try:
        cfg = load_config(args.config, parse_cfg_options(args.cfg_options))
        problems = check_dataset(cfg.data, progress=not args.no_progress)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for p in problems:
        print(f"{p.path}: {p.reason}")
    print(f"{len(problems)} problem(s) in {cfg.data.root}" if problems else f"{cfg.data.root}: no problems found")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
