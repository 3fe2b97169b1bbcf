"""Predict segmentation masks for an image, a folder of images (recursive), a list of images or a VOC split, from
a checkpoint alone.

    python tools/infer.py CHECKPOINT INPUT [OUTPUT] [--scales 1.0 1.25 1.5] [--flip/--no-flip] [--crf]
        [--overlay] [--cams] [--logits] [--gallery] [--split FILE | --list FILE] [--max-size PX] [--batch-size N]
        [--device cuda|cpu] [--overwrite] [--follow-symlinks] [--cfg-options infer.KEY=VALUE ...]
    torchrun --nproc-per-node N tools/infer.py CHECKPOINT INPUT OUTPUT ... --launcher pytorch

INPUT is an image file, a folder (every image under it), with --list FILE a folder whose images FILE names (one
path per line, relative to INPUT), or with --split NAME|FILE a VOC-layout root whose JPEGImages holds the split's
images. OUTPUT defaults to INPUT_pred beside INPUT (photo.jpg -> photo_pred/). Outputs mirror the input's relative
paths: masks/ (palette PNG, class indices), overlays/, cams/ (JPEG), logits/ (float16 .npy at 1/4 size),
labels/ and image_labels.json (the classes present), index.html (--gallery); see wsss/inference/folder/runner.py for the
layout. The mask holds background and the classes the classifier finds present (infer.mask_classes=present; "all"
is the reference's argmax over every class). Re-running skips images whose outputs all exist (--overwrite redoes
them). Symlinks that resolve outside INPUT are skipped by default (a link could expose any file the process can
read); --follow-symlinks reads those that point to regular image files, e.g. a val folder of links into
JPEGImages. Unreadable files and unsafe paths are skipped and listed in the summary; the exit status is still 0
(1 when no image could be processed). Scales, flip, max size and CRF constants default to the checkpoint's config
(infer.*); --cfg-options overrides any infer.* value. The model sees every image with its longest side at most
--max-size (default infer.max_size, 1024; 0: no cap of its own), and never over 2048 px at the largest scale
whatever the checkpoint or the options say; its mask comes back at full size. --crf runs within infer.crf.memory_mib
(default 3072 MiB) per call: an image whose estimate, pixels x (4 KB + 64 B x classes), exceeds it runs the CRF at
the largest reduced resolution that fits, its marginals brought back to full size. An OUTPUT where an output
could land on an input (INPUT, or INPUT inside OUTPUT/masks/, OUTPUT/thumbs/, ...) is refused. SIGTERM stops the
run within seconds, every finished image whole; a full disk stops it with one error naming the file (exit status
2), after writing summary.json where it can. It runs wsss.inference.predictor.Segmenter, the Python predictor;
CHECKPOINT may also be a tools/export.py --safetensors export. Under torchrun (--launcher pytorch, any number of
nodes) each rank takes a deterministic share of the sorted images balanced by pixel count and writes its outputs
as one process does; rank 0 then merges image_labels.json, summary.json, run.json and the gallery. A re-run, with
the same or another number of ranks, skips finished images. OUTPUT must be on a file system every node sees.
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
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("input", type=Path, help="an image, a folder of images, or a VOC root with --split")
    parser.add_argument("output", type=Path, nargs="?", help="output folder (default: INPUT_pred)")
    listing = parser.add_mutually_exclusive_group()
    listing.add_argument("--split", help="split name (ImageSets/Segmentation/NAME.txt) or split file")
    listing.add_argument("--list", type=Path, metavar="FILE", help="text file of image paths under INPUT, one per line")
    parser.add_argument("--scales", type=float, nargs="+", help="TTA scales (default: the checkpoint's)")
    parser.add_argument("--flip", action=argparse.BooleanOptionalAction, default=None, help="flip TTA")
    parser.add_argument(
        "--crf", action="store_true",
        help="dense CRF (infer.crf.*; torch backend: on --device; within infer.crf.memory_mib MiB, see above)",
    )  # fmt: skip
    parser.add_argument("--crf-workers", type=int, help="CRF processes per rank (pydensecrf, or on the CPU)")
    parser.add_argument("--overlay", action="store_true", help="write mask overlays (JPEG)")
    parser.add_argument("--cams", action="store_true", help="write CAM heatmaps of the predicted classes")
    parser.add_argument("--logits", action="store_true", help="write 1/4-size float16 logits (.npy)")
    parser.add_argument("--gallery", action="store_true", help="write index.html (implies --overlay --cams)")
    parser.add_argument(
        "--max-size", type=int,
        help="longest side the model sees, 0: no cap of its own (2048 px / the largest scale; default: infer.max_size)",
    )  # fmt: skip
    add_batch_size_argument(parser)
    parser.add_argument("--workers", type=int, default=2, help="image decoding processes per rank")
    parser.add_argument("--write-threads", type=int, default=2, help="threads encoding and writing the outputs")
    parser.add_argument("--device", help="cpu or cuda (default: cuda when available; cuda:LOCAL_RANK per rank)")
    parser.add_argument(
        "--launcher", choices=("none", "pytorch"), default="none",
        help="pytorch: one rank of `torchrun --nproc-per-node N` (each rank takes a share of the images balanced by "
        "pixels and runs --workers decoders and --crf-workers CRF processes: the CPU budget per rank)",
    )  # fmt: skip
    parser.add_argument(
        "--cfg-options", nargs="+", metavar="infer.KEY=VALUE",
        help="override the checkpoint's inference settings, e.g. infer.cls_thresh=0.4 infer.crf.iterations=5",
    )  # fmt: skip
    parser.add_argument(
        "--follow-symlinks", action="store_true",
        help="read symlinks to image files that point outside INPUT (skipped by default, for safety)",
    )  # fmt: skip
    parser.add_argument("--overwrite", action="store_true", help="redo images whose outputs exist")
    parser.add_argument("--no-progress", action="store_true")
    add_threads_argument(parser)
    args = parser.parse_args(argv)

    # --help, usage errors and missing files come at once, before torch is imported
    if error := input_error({"checkpoint": args.checkpoint, "--list": args.list}):
        return refuse(error)
    if not args.input.exists():
        return refuse(input_error({"INPUT": args.input}))
    # the decoding processes, and the CRF processes when given here (else counted once the checkpoint is read)
    chosen = args.threads or user_threads()
    apply_threads(args.threads, args.workers + (args.crf_workers or 0 if args.crf else 0))
    from wsss.config import parse_cfg_options
    from wsss.inference.folder.runner import InferenceOptions, run_inference
    from wsss.utils.distributed import check_launcher, finish_distributed, init_distributed

    options = InferenceOptions(
        scales=args.scales,
        flip=args.flip,
        crf=args.crf,
        overlay=args.overlay,
        cams=args.cams,
        logits=args.logits,
        gallery=args.gallery,
        batch_size=args.batch_size,
        overwrite=args.overwrite,
        num_workers=args.workers,
        write_threads=args.write_threads,
        crf_workers=args.crf_workers,
        threads=chosen,
        max_size=args.max_size,
        progress=not args.no_progress,
        follow_symlinks=args.follow_symlinks,
    )
    try:
        options.cfg_options = parse_cfg_options(args.cfg_options)
        check_launcher(args.launcher, "tools/infer.py CKPT INPUT OUTPUT")
        info = init_distributed(args.device)
    except (ValueError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    options.progress = options.progress and info.is_main
    try:
        summary = run_inference(args.checkpoint, args.input, args.output, args.split, options, info.device, args.list)
    except (OSError, ValueError, ImportError) as err:  # OSError: an output not written (a full disk), named
        print(f"error: {err}" if info.is_main or not info.enabled else f"error: [rank {info.rank}] {err}",
              file=sys.stderr)  # fmt: skip
        return 2
    finally:
        finish_distributed()
    if info.is_main:
        print(summary.format())
    return 1 if summary.skipped and not (summary.done or summary.existing) else 0


if __name__ == "__main__":
    exit_on_sigterm()  # SIGTERM unwinds like Ctrl-C: workers stop, the work dir's lock is released
    raise SystemExit(main())
