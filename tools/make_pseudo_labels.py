"""Export the pseudo labels of a training split for a second stage: the masks the training recipe makes, at full size.

    python tools/make_pseudo_labels.py CHECKPOINT --split train_aug OUT [--config CONFIG] [--crf]
        [--cfg-options KEY=VALUE ...] [--device cuda|cpu] [--batch-size N] [--overwrite]
    torchrun --nproc-per-node N tools/make_pseudo_labels.py CHECKPOINT --split train_aug OUT --launcher pytorch

For every image of the split, with its image-level labels from the training label file (data.label_file): the
checkpoint's multi-scale flipped CAMs (cam.scales), PAR (par.*) and the dual background thresholds
(cam.fg_thresh / cam.bg_thresh), as the training step makes its pseudo labels, on the whole image. The dataset
(data.*) and the constants are the checkpoint's config, or CONFIG's (--config), with --cfg-options on top; the model
is always the checkpoint's. --crf refines each thresholded score stack with the dense CRF (infer.crf.*) before the
thresholds combine, so pixels stay 255 where the refined stacks disagree.

Outputs in OUT (VOC layout; masks are VOC-palette PNGs of class indices):
  SegmentationClassPseudo/<id>.png       255 where uncertain: the second stage's training targets
  SegmentationClassPseudoDense/<id>.png  one background threshold (cam.infer_bg_thresh): every pixel a class
  ImageSets/Segmentation/<split>.txt     the ids exported
  mmseg_dataset.py, mmseg_train.py       an mmseg dataset snippet and a ready-to-edit DeepLabV3+ config on the masks
  image_labels.json, run.json, summary.json   the image-level labels used, the settings, what the run did
When the dataset has ground-truth masks for the images, the tools/eval.py commands that score the export are
printed: every pixel (the paper's Table 3) and certain pixels only (--certain-only).

Under torchrun (--launcher pytorch, any number of nodes) each rank takes a share of the sorted ids balanced by pixel
count and writes its masks atomically; rank 0 then writes the split file, configs and summary. A re-run, with the
same or another number of ranks, skips images whose masks exist (--overwrite redoes them); masks made with other
settings (the checkpoint known by its SHA-256, not its path) or without a readable run.json are refused. OUT is
locked for the run (OUT/export.lock): a second export into it stops at once. OUT must be on a file system every node
sees. --crf-workers CRF processes run per rank.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from wsss.utils.lifetime import exit_on_sigterm
from wsss.utils.startup import (
    add_batch_size_argument,
    add_threads_argument,
    apply_threads,
    input_error,
    refuse,
    user_threads,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path, help="a wsss checkpoint (.pth) or a --safetensors export")
    parser.add_argument("output", type=Path, help="output folder OUT")
    parser.add_argument(
        "--split", help="split name (ImageSets/Segmentation/NAME.txt) or file (default: data.train_split)"
    )
    parser.add_argument(
        "--config", type=Path, help="config whose data, cam, par and infer.crf replace the checkpoint's"
    )
    parser.add_argument(
        "--crf", action="store_true",
        help="dense CRF on each score stack (infer.crf.*; within infer.crf.memory_mib MiB, a larger image at a "
        "reduced resolution)",
    )  # fmt: skip
    parser.add_argument("--crf-workers", type=int,
                        help="CRF processes per rank (pydensecrf; the torch backend on the CPU)")
    add_batch_size_argument(parser)
    parser.add_argument("--workers", type=int,
                        help="image decoding processes per rank (default: data.num_workers on a GPU, 0 on the CPU)")
    parser.add_argument("--write-threads", type=int, default=2, help="threads encoding and writing the masks")
    parser.add_argument("--cfg-options", nargs="+", metavar="KEY=VALUE", help="override config values")
    parser.add_argument("--device", help="cpu or cuda (default: cuda when available; cuda:LOCAL_RANK per rank)")
    parser.add_argument(
        "--launcher", choices=("none", "pytorch"), default="none",
        help="pytorch: one rank of `torchrun --nproc-per-node N` (each rank exports a share balanced by pixels)",
    )  # fmt: skip
    parser.add_argument("--overwrite", action="store_true", help="redo images whose masks exist")
    parser.add_argument("--no-progress", action="store_true")
    add_threads_argument(parser)
    args = parser.parse_args(argv)

    # --help, usage errors and missing files come at once, before torch is imported
    if error := input_error({"checkpoint": args.checkpoint, "--config": args.config}):
        return refuse(error)
    chosen = args.threads or user_threads()  # else the export counts the CRF processes once the config is read
    apply_threads(args.threads, (args.workers or 0) + (args.crf_workers or 0 if args.crf else 0))
    from wsss.config import parse_cfg_options
    from wsss.inference.exports.pseudo_labels import ExportOptions, export_pseudo_labels
    from wsss.utils.distributed import check_launcher, finish_distributed, init_distributed

    try:
        options = ExportOptions(
            split=args.split, config=args.config, cfg_options=parse_cfg_options(args.cfg_options), crf=args.crf,
            crf_workers=args.crf_workers, threads=chosen, batch_size=args.batch_size, num_workers=args.workers,
            write_threads=args.write_threads, overwrite=args.overwrite, progress=not args.no_progress,
        )  # fmt: skip
        check_launcher(args.launcher, "tools/make_pseudo_labels.py CKPT --split SPLIT OUT")
        info = init_distributed(args.device)
    except (ValueError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        summary = export_pseudo_labels(args.checkpoint, args.output, options, info.device)
    except (OSError, ValueError, ImportError) as err:  # OSError: a missing file, or an output not written, named
        print(f"error: {err}" if not info.enabled else f"error: [rank {info.rank}] {err}", file=sys.stderr)
        return 2
    finally:
        finish_distributed()
    if info.is_main:
        print(summary.format())
    return 1 if summary.skipped and not summary.exported and info.is_main else 0


if __name__ == "__main__":
    exit_on_sigterm()  # SIGTERM unwinds like Ctrl-C: CRF workers stop, finished masks are whole
    raise SystemExit(main())
