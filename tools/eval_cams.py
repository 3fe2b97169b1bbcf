"""CAM and pseudo-label mIoU on a labelled split (the paper's Tables 3-4), labels from the ground-truth masks.

    python tools/eval_cams.py CHECKPOINT [--split train] [--aux] [--bg-thresholds 0.3:0.7:0.05] [--pseudo]
        [--work-dir DIR] [--out DIR] [--data-root DIR] [--save-cams] [--save-pseudo] [--device cuda|cpu]
        [--batch-size N] [--launcher none|pytorch]

CHECKPOINT is a wsss checkpoint (.pth) or a tools/export.py --safetensors export: only the model is needed.
CAMs at the checkpoint's cam.scales (with flips) of the final (or --aux) classifier are scored for every
background threshold of the sweep; --pseudo also scores the pseudo labels twice: the dual-threshold + PAR
labels on their certain pixels (the training loss's view; uncertain fraction reported), and single-threshold
(cam.infer_bg_thresh) + PAR labels on every pixel (comparable with the paper's Table 3). The dataset is the
one of the checkpoint's config (--data-root overrides its root). The scores are printed under their protocol line
(checkpoint step, split and its size, scales, flip, CRF off) and cam_eval.json records it, where tools/report.py
reads it (Table 3).

Outputs (nothing is written beside the checkpoint, which may be read-only), all in one folder OUT:
  OUT/cam_eval.json     the scores; --save-cams adds OUT/cams/<id>.npy ((C-1, H, W) float16), --save-pseudo
                        OUT/pseudo/<id>.png
  --out DIR             OUT itself; default: WORK_DIR/cam_eval_<checkpoint name>_<split>[_aux]
  --work-dir DIR        WORK_DIR; default: work_dirs/<run name> in the current folder, the run name being the
                        last part of the work dir the checkpoint was trained in (the config's name for configs/)

Several GPUs or nodes: ``torchrun --nproc-per-node N tools/eval_cams.py CHECKPOINT ... --device cuda --launcher
pytorch``. Each rank scores every N-th image (and saves its CAMs and pseudo labels), the confusion matrices are
summed across ranks, and the scores equal one process's exactly; rank 0 alone prints and writes cam_eval.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from wsss.utils.startup import add_batch_size_argument, add_threads_argument, apply_threads, input_error, refuse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path, help="a wsss checkpoint (.pth) or a --safetensors export")
    parser.add_argument("--split", default="train", help="split name or file (default: train)")
    parser.add_argument("--aux", action="store_true", help="score the auxiliary classifier's CAMs")
    parser.add_argument("--bg-thresholds", default="0.3:0.7:0.05", help="start:stop:step (stop included) or a,b,c")
    parser.add_argument("--pseudo", action="store_true", help="also score the pseudo labels")
    parser.add_argument("--work-dir", type=Path, help="the default output folder goes under it (see above)")
    parser.add_argument("--out", type=Path, help="output folder (default: see above)")
    parser.add_argument("--data-root", type=Path, help="dataset root (default: data.root of the checkpoint)")
    parser.add_argument("--save-cams", action="store_true", help="export the CAMs as float16 .npy")
    parser.add_argument("--save-pseudo", action="store_true", help="export the pseudo labels as PNG (implies --pseudo)")
    parser.add_argument("--max-images", type=int, help="score only the first N images")
    add_batch_size_argument(parser)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--launcher", choices=("none", "pytorch"), default="none", help="pytorch: under torchrun")
    add_threads_argument(parser)
    args = parser.parse_args(argv)

    # --help, usage errors and missing files come at once, before torch is imported
    if error := input_error({"checkpoint": args.checkpoint}, {"--data-root": args.data_root}):
        return refuse(error)
    from wsss.config import DataConfig

    # the loader's processes, on a GPU only (the checkpoint's data.num_workers needs torch to read)
    apply_threads(args.threads, 0 if args.device.startswith("cpu") else DataConfig().num_workers)
    from wsss.evaluation.cam_eval import parse_thresholds, run_cam_eval
    from wsss.utils.distributed import check_launcher, finish_distributed, rank_and_world

    try:
        check_launcher(args.launcher, "tools/eval_cams.py CKPT")
    except RuntimeError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
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
            work_dir=args.work_dir,
            batch_size=args.batch_size,
        )
        is_main = rank_and_world()[0] == 0
    except (OSError, ValueError) as err:  # OSError: a missing file or an output not written, named
        print(f"error: {err}", file=sys.stderr)
        return 2
    finally:
        finish_distributed()
    if is_main:
        print(result.format())
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
