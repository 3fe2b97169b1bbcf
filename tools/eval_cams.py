"""CAM and pseudo-label mIoU on a labelled split (the paper's Tables 3-4), labels from the ground-truth masks.

    python tools/eval_cams.py CHECKPOINT [--split train] [--aux] [--bg-thresholds 0.3:0.7:0.05] [--pseudo]
        [--out DIR] [--data-root DIR] [--save-cams] [--save-pseudo] [--device cuda|cpu]

CAMs at the checkpoint's cam.scales (with flips) of the final (or --aux) classifier are scored for every
background threshold of the sweep; --pseudo also scores the pseudo labels twice: the dual-threshold + PAR
labels on their certain pixels (the training loss's view; uncertain fraction reported), and single-threshold
(cam.infer_bg_thresh) + PAR labels on every pixel (comparable with the paper's Table 3). The dataset is the
one of the checkpoint's config (--data-root overrides its root). Writes DIR/cam_eval.json (default DIR:
CHECKPOINT_DIR/cam_eval_SPLIT[_aux]); --save-cams writes DIR/cams/<id>.npy ((C-1, H, W) float16),
--save-pseudo DIR/pseudo/<id>.png.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from wsss.evaluation.cam_eval import parse_thresholds, run_cam_eval


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--split", default="train", help="split name or file (default: train)")
    parser.add_argument("--aux", action="store_true", help="score the auxiliary classifier's CAMs")
    parser.add_argument("--bg-thresholds", default="0.3:0.7:0.05", help="start:stop:step (stop included) or a,b,c")
    parser.add_argument("--pseudo", action="store_true", help="also score the pseudo labels")
    parser.add_argument("--out", type=Path, help="output folder")
    parser.add_argument("--data-root", type=Path, help="dataset root (default: data.root of the checkpoint)")
    parser.add_argument("--save-cams", action="store_true", help="export the CAMs as float16 .npy")
    parser.add_argument("--save-pseudo", action="store_true", help="export the pseudo labels as PNG (implies --pseudo)")
    parser.add_argument("--max-images", type=int, help="score only the first N images")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)

    try:
        result, path = run_cam_eval(
            args.checkpoint,
            split=args.split,
            thresholds=parse_thresholds(args.bg_thresholds),
            out=args.out,
            device=args.device,
            data_root=args.data_root,
            aux=args.aux,
            pseudo=args.pseudo,
            save_cams=args.save_cams,
            save_pseudo=args.save_pseudo,
            max_images=args.max_images,
            progress=not args.no_progress,
        )
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(result.format())
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
