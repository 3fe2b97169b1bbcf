"""Pre-train the backbone as a multi-label image classifier and save it for ``model.pretrained``.

    python tools/pretrain.py CONFIG [--work-dir DIR] [--cfg-options k=v ...] [--device cpu|cuda]

Writes WORK_DIR/backbone.pth (the backbone's timm state_dict under "state_dict", with the config); a WSSS run
loads it with --cfg-options model.pretrained=WORK_DIR/backbone.pth. An interrupted run, started again with the
same command, resumes from WORK_DIR/pretrain_state.pth (see wsss/engine/pretrain.py).
"""

from __future__ import annotations

import argparse
import sys

from wsss.utils.lifetime import exit_on_sigterm
from wsss.utils.startup import add_threads_argument, apply_threads, input_error, refuse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="config file, e.g. configs/toy_v3_pretrain.py")
    parser.add_argument("--work-dir", help="output folder (default: work_dir in the config)")
    parser.add_argument("--cfg-options", nargs="+", metavar="KEY=VALUE", help="override config values")
    parser.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when available")
    add_threads_argument(parser)
    args = parser.parse_args(argv)

    # --help, usage errors and missing files come at once, before torch is imported
    if error := input_error({"config": args.config}):
        return refuse(error)
    from wsss.config import ConfigError, load_config, parse_cfg_options

    try:
        cfg = load_config(args.config, parse_cfg_options(args.cfg_options))
    except (OSError, ValueError) as err:  # ConfigError is a ValueError
        return refuse(str(err))
    apply_threads(args.threads, cfg.data.num_workers)
    import torch

    from wsss.engine.optim import NonFiniteLossError
    from wsss.engine.pretrain import pretrain
    from wsss.models.backbone import PretrainedUnavailableError, require_vision_transformer

    try:
        require_vision_transformer(cfg.model.backbone)
        work_dir = args.work_dir or cfg.work_dir
        if not work_dir:
            raise ConfigError("no work dir: pass --work-dir or set work_dir in the config")
        device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        result = pretrain(cfg, work_dir, device)
    except (ConfigError, FileNotFoundError, NonFiniteLossError, PretrainedUnavailableError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    scores = "  ".join(f"{k} {v:.2f}" for k, v in result.metrics.items())
    print(f"pre-trained {result.step} iterations in {result.seconds / 60:.1f} min; val: {scores}")
    print(f"backbone: {result.checkpoint}")
    return 0


if __name__ == "__main__":
    exit_on_sigterm()  # SIGTERM unwinds like Ctrl-C: data workers stop; the last saved state stays whole
    raise SystemExit(main())
