"""Rank of deep attention-only transformers vs. the attention offset gamma (Centered Self-Attention, Fig. 1).

Writes ``rank.csv`` (arch,init,gamma,depth,rank) and one heatmap ``rank_<arch>_<init>.png`` per
(arch, init) into ``--out``. The model is described in :mod:`wsss.analysis.rank_simulation`.

    python tools/simulate_rank.py --out work_dirs/rank_sim
    python tools/simulate_rank.py --out /tmp/rank --depth 50 --gammas -1.5:1.5:0.5 --archs post_ln
"""

from __future__ import annotations

import argparse
import sys
import time

from wsss.analysis.constants import ARCHS, INITS, RANK_THRESHOLD
from wsss.utils.startup import add_threads_argument, apply_threads


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--depth", type=int, default=2000, help="number of layers")
    parser.add_argument("--gammas", default="-1.5:1.5:0.1", help="START:STOP:STEP (STOP included) or a comma list")
    parser.add_argument("--n", type=int, default=100, help="tokens = token dimension (input: n x n identity)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the U[0,1] weights")
    parser.add_argument("--threshold", type=float, default=RANK_THRESHOLD, help="relative singular-value threshold")
    parser.add_argument("--archs", nargs="+", choices=ARCHS, default=list(ARCHS))
    parser.add_argument("--inits", nargs="+", choices=INITS, default=list(INITS))
    add_threads_argument(parser)
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    # "-1.5:1.5:0.1" starts like an option, and argparse would refuse it as the value of --gammas.
    argv = list(argv)
    if "--gammas" in argv[:-1]:
        i = argv.index("--gammas")
        argv[i : i + 2] = [f"--gammas={argv[i + 1]}"]
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)

    # after parsing: --help and usage errors come at once
    apply_threads(args.threads)
    import torch

    from wsss.analysis.rank_simulation import parse_gammas, run_grid, write_outputs

    gammas = parse_gammas(args.gammas)
    start = time.perf_counter()
    results = run_grid(
        args.archs,
        args.inits,
        gammas,
        args.depth,
        n=args.n,
        seed=args.seed,
        threshold=args.threshold,
        progress=not args.no_progress,
    )
    elapsed = time.perf_counter() - start
    paths = write_outputs(args.out, results, gammas, max_rank=args.n)
    print(
        f"{len(results)} (arch, init) x {len(gammas)} gammas x depth {args.depth} (n={args.n}) simulated in "
        f"{elapsed:.1f} s with {torch.get_num_threads()} thread(s); wrote {', '.join(str(p) for p in paths)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
