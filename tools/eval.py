"""Score predicted label PNGs against ground-truth label PNGs (mIoU, aAcc, mAcc as mmseg's IoUMetric).

Files are matched by relative path without extension, recursively. Example (VOC val):
    python tools/eval.py work_dirs/run/pred data/VOC2012/SegmentationClass \\
        --ids data/VOC2012/ImageSets/Segmentation/val.txt --json work_dirs/run/val_miou.json

Pseudo labels (tools/make_pseudo_labels.py OUT): OUT/SegmentationClassPseudoDense scored as above is "every pixel",
the paper's Table 3 number; OUT/SegmentationClassPseudo with --certain-only is "certain pixels only": pixels
predicted --ignore-index (255, uncertain) are not scored, and their share of the scored pixels is printed (as
tools/eval_cams.py --pseudo names both).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from wsss.evaluation.constants import METRICS
from wsss.utils.startup import add_threads_argument, apply_threads, input_error, refuse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pred_dir", type=Path, help="predicted index masks (values 0..C-1)")
    parser.add_argument("gt_dir", type=Path, help="ground-truth index masks (values 0..C-1, ignore index)")
    classes = parser.add_mutually_exclusive_group()
    classes.add_argument(
        "--classes",
        help="class list file, background first (default: image_labels.json that tools/infer.py writes beside "
        "the masks, else the 21 VOC classes, refused when the masks hold fewer labels)",
    )
    classes.add_argument("--num-classes", type=int, help="number of classes, when there are no names")
    parser.add_argument("--ids", type=Path, help="score only the names listed in this file (e.g. val.txt)")
    parser.add_argument("--json", type=Path, help="write the metrics here as JSON")
    parser.add_argument("--ignore-index", type=int, default=255)
    parser.add_argument(
        "--reduce-zero-label",
        action="store_true",
        help="ground-truth 0 is ignored and other labels decrease by 1 (mmseg); predictions are not changed",
    )
    parser.add_argument(
        "--certain-only", action="store_true",
        help="pixels predicted --ignore-index (uncertain pseudo labels) are not scored; their share is reported",
    )  # fmt: skip
    parser.add_argument("--metrics", nargs="+", default=["mIoU"], choices=METRICS)
    parser.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--workers", type=int, default=4, help="PNG decoding threads")
    add_threads_argument(parser)
    args = parser.parse_args(argv)

    # --help, usage errors and missing files come at once, before torch is imported
    error = input_error({"--classes": args.classes, "--ids": args.ids},
                        {"pred_dir": args.pred_dir, "gt_dir": args.gt_dir})  # fmt: skip
    if error:
        return refuse(error)
    apply_threads(args.threads, args.workers)
    import torch

    from wsss.data.classes import VOC_CLASSES, load_classes
    from wsss.evaluation.folders import (
        check_classes_seen,
        classes_beside,
        evaluate_certain_pixels,
        evaluate_folders,
        save_metrics_json,
    )
    from wsss.evaluation.metrics import format_table

    found = None if args.classes or args.num_classes else classes_beside(args.pred_dir)
    if args.num_classes is not None:
        names = [str(i) for i in range(args.num_classes)]
    else:
        names = load_classes(args.classes) if args.classes else found[0] if found else list(VOC_CLASSES)
    if found:
        print(f"classes from {found[1]}: {', '.join(names)}")
    ids = args.ids.read_text().splitlines() if args.ids else None
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    options = dict(class_names=names, ids=ids, ignore_index=args.ignore_index, reduce_zero_label=args.reduce_zero_label,
                   metrics=args.metrics, device=device, num_workers=args.workers, progress=True)  # fmt: skip
    certain = None
    try:
        if args.certain_only:
            certain = evaluate_certain_pixels(args.pred_dir, args.gt_dir, len(names), **options)
            result = certain.metrics
        else:
            result = evaluate_folders(args.pred_dir, args.gt_dir, len(names), **options)
        if not (args.classes or args.num_classes or found):
            check_classes_seen(result, "the default VOC class list")
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(format_table(result))
    print("  ".join(f"{k} {v:.2f}" for k, v in result.summary.items()))
    extra = {}
    if certain is not None:
        extra = {"certain_only": True, "uncertain_fraction": certain.uncertain_fraction,
                 "uncertain_pixels": certain.uncertain, "scored_pixels": certain.scored}  # fmt: skip
        print(
            f"certain pixels only: {certain.uncertain} of {certain.scored} scored pixels "
            f"({100 * certain.uncertain_fraction:.2f} %) predicted uncertain ({args.ignore_index}) and not scored; "
            "not comparable with published tables, which score every pixel"
        )
    if args.json:
        save_metrics_json(result, args.json, pred_dir=str(args.pred_dir), gt_dir=str(args.gt_dir), **extra)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
