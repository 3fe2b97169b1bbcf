"""Evaluate a checkpoint on the config's validation split, as mmseg's tools/test.py does.

    python tools/test.py CONFIG CHECKPOINT [--out DIR] [--show-dir DIR] [--tta] [--cfg-options k=v ...]
        [--device cuda|cpu]

CHECKPOINT is a wsss checkpoint (.pth) or a tools/export.py --safetensors export. The masks of data.val_split
(under data.root) are predicted as tools/infer.py predicts them and scored against data.mask_dir with mmseg
IoUMetric's keys (aAcc, mIoU, mAcc, per-class IoU). Predictions and metrics.json go to --out (default:
test_<checkpoint name> beside the checkpoint); --show-dir writes them there together with mask overlays, CAMs and
an index.html gallery. --tta uses infer.scales and infer.flip of the config.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from wsss.config import ConfigError, load_config, parse_cfg_options
from wsss.evaluation.metrics import format_table
from wsss.evaluation.split_eval import evaluate_checkpoint


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="the config the checkpoint was trained with (it names the dataset)")
    parser.add_argument("checkpoint", type=Path, help="a wsss checkpoint (.pth) or a --safetensors export")
    outputs = parser.add_mutually_exclusive_group()
    outputs.add_argument("--out", type=Path, help="folder for the predicted masks and metrics.json")
    outputs.add_argument("--show-dir", type=Path, help="as --out, with overlays, CAMs and index.html")
    parser.add_argument("--tta", action="store_true", help="multi-scale + flip (infer.scales, infer.flip)")
    parser.add_argument("--cfg-options", nargs="+", metavar="KEY=VALUE", help="override config values")
    parser.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    args = parser.parse_args(argv)

    output = args.show_dir or args.out or args.checkpoint.with_name(f"test_{args.checkpoint.stem}")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        cfg = load_config(args.config, parse_cfg_options(args.cfg_options))
        result = evaluate_checkpoint(cfg, args.checkpoint, output, tta=args.tta, show=args.show_dir is not None,
                                     device=device)  # fmt: skip
    except (ConfigError, FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(result.inference.format())
    print(format_table(result.metrics))
    print("  ".join(f"{k} {v:.2f}" for k, v in result.metrics.summary.items()))
    print(f"wrote {result.metrics_file}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
