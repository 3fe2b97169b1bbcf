"""Evaluate a checkpoint on the config's validation split, as mmseg's tools/test.py does.

    python tools/test.py CONFIG CHECKPOINT [--work-dir DIR] [--out DIR] [--show-dir DIR] [--tta] [--crf]
        [--split NAME] [--format-only] [--cfg-options k=v ...] [--device cuda|cpu] [--launcher none|pytorch]

CHECKPOINT is a wsss checkpoint (.pth) or a tools/export.py --safetensors export. The masks of data.val_split
(under data.root) are predicted afresh as tools/infer.py predicts them and scored against data.mask_dir with mmseg
IoUMetric's keys (aAcc, mIoU, mAcc, per-class IoU). The inference settings are those of CONFIG (infer.*, with
--cfg-options); one scale without flip unless --tta, which uses infer.scales and infer.flip. --crf refines each
mask with the dense CRF (infer.crf.*): `--tta --crf` is the paper's protocol (multi-scale + flip + dense CRF).
infer.crf.backend=torch (default) needs no compiled package: on a GPU it runs where the model runs, many images per
call; on the CPU in infer.crf.workers processes beside the model, as infer.crf.backend=pydensecrf (pip install
pydensecrf2: needs a compiler) does, and faster per core than it (docs/benchmarks.md, "Dense CRF").

Outputs (nothing is written beside the checkpoint, which may be read-only):
  --work-dir DIR   metrics.json goes to DIR/test_<checkpoint name>[_tta][_crf]/, and so do the predicted masks
                   (masks/<id>.png) unless --out or --show-dir is given; default DIR: work_dirs/<config name>
                   (mmseg's ./work_dirs/<config stem>)
  --out DIR        the predicted masks: DIR/masks/<id>.png (palette PNGs of class indices)
  --show-dir DIR   the painted images: overlays/, CAMs (cams/), thumbnails, ground truth (gt/) and an index.html
                   gallery, with the masks they show; with --out as well, the masks are also copied to --out

The VOC test server (mmseg's --format-only): ``--split test --format-only --out DIR`` scores nothing (no ground
truth needed) and writes DIR/results/VOC2012/Segmentation/comp6_test_cls/<id>.png and DIR/results.tar.gz to upload,
from the predicted masks in DIR/masks/ (the run folder gets submission.json alone); it prints how to submit. Every
run prints its protocol line (scales, flip, CRF, mask_classes, split and size, step) and records it in metrics.json
(submission.json with --format-only), where tools/report.py reads it.

Several GPUs or nodes: ``torchrun --nproc-per-node N tools/test.py CONFIG CHECKPOINT ... --launcher pytorch``.
Each rank predicts its share of the images and scores every N-th mask, the confusion matrices are summed across
ranks, and the metrics equal one process's exactly; rank 0 alone prints and writes metrics.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from wsss.utils.startup import add_threads_argument, apply_threads, config_workers, input_error, refuse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="the config the checkpoint was trained with (it names the dataset)")
    parser.add_argument("checkpoint", type=Path, help="a wsss checkpoint (.pth) or a --safetensors export")
    parser.add_argument("--work-dir", type=Path, help="metrics.json under DIR/test_<checkpoint name>[_tta]/")
    parser.add_argument("--out", type=Path, help="folder for the predicted masks (DIR/masks/<id>.png)")
    parser.add_argument("--show-dir", type=Path, help="folder for the painted images and index.html")
    parser.add_argument("--tta", action="store_true", help="multi-scale + flip (infer.scales, infer.flip)")
    parser.add_argument(
        "--crf", action="store_true",
        help="dense CRF on each mask (infer.crf.*; within infer.crf.memory_mib MiB, a larger image at a reduced "
        "resolution; see above)",
    )  # fmt: skip
    parser.add_argument("--cfg-options", nargs="+", metavar="KEY=VALUE", help="override config values")
    parser.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--launcher", choices=("none", "pytorch"), default="none", help="pytorch: under torchrun")
    # the split, and the VOC test server (wsss/evaluation/voc_submission.py)
    parser.add_argument("--split", help="split name or file (default: data.val_split); run folder test_<ckpt>_<split>")
    parser.add_argument("--format-only", action="store_true", help="no scoring: the VOC server's archive in --out")
    add_threads_argument(parser)
    args = parser.parse_args(argv)

    # --help, usage errors and missing files come at once, before torch is imported
    if error := input_error({"config": args.config, "checkpoint": args.checkpoint}):
        return refuse(error)
    from wsss.config import ConfigError, load_config, parse_cfg_options

    try:
        cfg = load_config(args.config, parse_cfg_options(args.cfg_options))
    except (OSError, ValueError) as err:  # ConfigError is a ValueError
        return refuse(str(err))
    apply_threads(args.threads, config_workers(cfg, args.crf, args.device))  # the decoding and CRF processes
    import torch

    from wsss.evaluation.metrics import format_table
    from wsss.evaluation.protocol import run_dir_name
    from wsss.evaluation.split_eval import evaluate_checkpoint
    from wsss.utils.distributed import check_launcher, finish_distributed, rank_and_world

    try:
        check_launcher(args.launcher, "tools/test.py CONFIG CKPT")
    except RuntimeError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2

    work_dir = args.work_dir or Path("work_dirs") / Path(args.config).stem
    run_dir = work_dir / run_dir_name(args.checkpoint, args.split, args.tta, args.crf)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        result = evaluate_checkpoint(cfg, args.checkpoint, run_dir, out=args.out, show_dir=args.show_dir,
                                     tta=args.tta, crf=args.crf, device=device, split=args.split,
                                     format_only=args.format_only)  # fmt: skip
        is_main = rank_and_world()[0] == 0
    except (ConfigError, OSError, ValueError) as err:  # OSError: a missing file or an output not written, named
        print(f"error: {err}", file=sys.stderr)
        return 2
    finally:
        finish_distributed()
    if not is_main:
        return 0
    print(result.inference.format())
    print(result.protocol.line())
    if result.submission is not None:
        print(f"wrote {result.submission.archive} ({result.submission.folder}), protocol in {result.metrics_file}")
        print(result.submission.how_to_submit())
        return 0
    print(format_table(result.metrics))
    print("  ".join(f"{k} {v:.2f}" for k, v in result.metrics.summary.items()))
    print(f"wrote {result.metrics_file}, masks in {result.masks}" + (f", {result.gallery}" if result.gallery else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
