"""Run an ablation grid on a config: the paper's Table 4 (losses x centering) and/or the attention variants.

    python tools/ablate.py CONFIG [--grid table4|variants|all] [--out DIR] [--cfg-options k=v ...]

Each row trains in OUT/<row>/ (an interrupted grid resumes); the table goes to OUT/results.md and .json.
"""

from __future__ import annotations

import argparse

from wsss.utils.startup import add_threads_argument, apply_threads, input_error, refuse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="base config, e.g. configs/toy_centered.py")
    parser.add_argument("--grid", default="all", choices=("table4", "variants", "all"))
    parser.add_argument("--rows", nargs="+", help="only these rows (names as printed in the table)")
    parser.add_argument("--out", default="work_dirs/ablation", help="output folder")
    parser.add_argument("--cfg-options", nargs="+", metavar="KEY=VALUE", help="overrides for every row")
    parser.add_argument("--device", choices=("cpu", "cuda"))
    parser.add_argument("--cosine-images", type=int, default=32, help="val images for the cosine similarity")
    add_threads_argument(parser)
    args = parser.parse_args(argv)

    # --help, usage errors and missing files come at once, before torch is imported
    if error := input_error({"config": args.config}):
        return refuse(error)
    from wsss.config import load_config, parse_cfg_options

    try:
        cfg = load_config(args.config, parse_cfg_options(args.cfg_options))
    except (OSError, ValueError) as err:  # ConfigError is a ValueError
        return refuse(str(err))
    apply_threads(args.threads, cfg.data.num_workers)
    from wsss.analysis.ablation import format_results, grid, run_grid
    rows = grid(args.grid)
    if args.rows:
        unknown = sorted(set(args.rows) - set(rows))
        if unknown:
            parser.error(f"unknown rows {unknown}; the grid has {sorted(rows)}")
        rows = {k: v for k, v in rows.items() if k in args.rows}
    results = run_grid(cfg, rows, args.out, device=args.device, cosine_images=args.cosine_images)
    print(format_results(results), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
