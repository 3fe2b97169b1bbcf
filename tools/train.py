"""Train a model from a config.

    python tools/train.py CONFIG [--work-dir DIR] [--resume [CKPT] | --overwrite] [--amp | --no-amp]
        [--cfg-options k=v ...] [--device cpu|cuda] [--launcher none|pytorch]

A work dir holds one run: a second run in it stops with an error while the first holds its lock, and a fresh
start over its checkpoints needs --resume (continue; the schedule follows the current config) or --overwrite.
--overwrite deletes nothing until the config, the data and the model have been checked; a fresh start moves the
earlier run's log.txt, scalars.jsonl and tb/ to WORK_DIR/earlier_runs/<time>/.

Several GPUs or nodes: ``torchrun --nproc-per-node N tools/train.py CONFIG --launcher pytorch`` (the launcher
is also read from the environment when not given). ``--local-rank`` (torch.distributed.launch) is accepted and
ignored: each process takes LOCAL_RANK from the environment.
"""

from __future__ import annotations

import argparse
import sys

from wsss.utils.lifetime import exit_on_sigterm
from wsss.utils.startup import add_threads_argument, apply_threads, input_error, refuse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="config file, e.g. configs/voc_centered.py")
    parser.add_argument("--work-dir", help="output folder (default: work_dir in the config)")
    parser.add_argument(
        "--resume", nargs="?", const=True, default=None,
        help="resume from CKPT, or with no value from the work dir's newest checkpoint",
    )  # fmt: skip
    parser.add_argument(
        "--overwrite", action="store_true",
        help="start from scratch in a work dir that holds checkpoints (deleted once config, data, model are checked)",
    )  # fmt: skip
    parser.add_argument(
        "--amp", action=argparse.BooleanOptionalAction, default=None,
        help="bf16 autocast on GPU (default: train.amp in the config)",
    )  # fmt: skip
    parser.add_argument("--cfg-options", nargs="+", metavar="KEY=VALUE", help="override config values")
    parser.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when available")
    parser.add_argument("--launcher", choices=("none", "pytorch"), help="default: from torchrun's environment")
    parser.add_argument("--local-rank", "--local_rank", type=int, help=argparse.SUPPRESS)
    add_threads_argument(parser)
    args = parser.parse_args(argv)

    if args.resume and args.overwrite:
        parser.error("--resume and --overwrite exclude each other")
    # --help, usage errors and missing files come at once, before torch is imported
    resume = args.resume if isinstance(args.resume, str) else None
    if error := input_error({"config": args.config, "--resume checkpoint": resume}):
        return refuse(error)
    from wsss.config import ConfigError, load_config, parse_cfg_options

    try:
        options = parse_cfg_options(args.cfg_options)
        if args.amp is not None:
            options["train.amp"] = args.amp
        cfg = load_config(args.config, options)
    except (OSError, ValueError) as err:  # ConfigError is a ValueError
        return refuse(str(err))
    apply_threads(args.threads, cfg.data.num_workers)
    from wsss.engine.checkpoint import NonFiniteWeightsError
    from wsss.engine.optim import NonFiniteLossError
    from wsss.engine.train import train
    from wsss.models.backbone import PretrainedUnavailableError, require_vision_transformer
    from wsss.utils.distributed import PeerLostError, check_launcher

    try:
        check_launcher(args.launcher)
        require_vision_transformer(cfg.model.backbone)
    except (ConfigError, FileNotFoundError, RuntimeError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        result = train(cfg, work_dir=args.work_dir, resume=args.resume, device=args.device, overwrite=args.overwrite)
    except (NonFiniteLossError, NonFiniteWeightsError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except (FileNotFoundError, ValueError, ImportError, PretrainedUnavailableError, PeerLostError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if result.is_main:
        if result.val is not None:
            print("final val: " + "  ".join(f"{k} {v:.2f}" for k, v in result.val.metrics.items()))
        print(f"checkpoint: {result.checkpoint}")
    return 0


if __name__ == "__main__":
    exit_on_sigterm()  # SIGTERM unwinds like Ctrl-C: workers stop, the work dir's lock is released
    raise SystemExit(main())
