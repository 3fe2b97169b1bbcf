"""Per-layer oversmoothing diagnostics of one or more ViTs over a folder of images: layers.csv and layers.png.

    python tools/diagnose.py (CHECKPOINT | --timm NAME | --config FILE) [CHECKPOINT ...] IMAGES [--out DIR]
        [--size 224] [--max-images N] [--pretrained hub|FILE|none] [--label NAME ...] [--device cpu|cuda]
        [--threads N] [--seed 0] [--title TEXT]

Models: wsss checkpoints (positional, before IMAGES), then every --config FILE (a wsss config: its backbone
and attention variant, heads not built) and --timm NAME (timm's ViT, with wsss's `vanilla` attention, the
same function as timm's, in every block) in the order given; --label names them in that order (default:
checkpoint folder/stem, config stem, timm name). --pretrained applies to --timm (default hub) and --config
(default: the config's model.pretrained); none means random init, drawn with --seed, so random-init
variants share their weights. Every image is resized (shorter side) and center-cropped to --size. Per
block: token cosine similarity, token effective rank and attention numerical rank, mean and std over the
images (wsss/analysis/diagnose.py). Unreadable images are reported and skipped.

    python tools/diagnose.py --config configs/voc_vanilla.py --config configs/voc_centered.py \\
        data/toy_voc/JPEGImages --pretrained none --max-images 32 --out work_dirs/diagnose_init
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from wsss.analysis.constants import RANK_THRESHOLD
from wsss.utils.startup import add_threads_argument, apply_threads, input_error, refuse


def default_label(kind: str, source: str) -> str:
    """``folder/stem`` of a checkpoint, the stem of a config, a timm name as given."""
    path = Path(source)
    return {"checkpoint": f"{path.parent.name}/{path.stem}", "config": path.stem}.get(kind, source)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", type=Path, metavar="[CHECKPOINT ...] IMAGES")
    parser.add_argument("--timm", dest="sources", action="append", type=lambda s: ("timm", s), metavar="NAME")
    parser.add_argument("--config", dest="sources", action="append", type=lambda s: ("config", s), metavar="FILE")
    parser.add_argument("--out", type=Path, default=Path("work_dirs/diagnose"), help="output folder")
    parser.add_argument("--size", type=int, default=224, help="square input side (default: 224)")
    parser.add_argument("--max-images", type=int, help="use the first N readable images (default: all)")
    parser.add_argument("--pretrained", help="hub, a timm state_dict file, or none (random init)")
    parser.add_argument("--label", nargs="+", default=[], help="one name per model, in model order")
    parser.add_argument("--seed", type=int, default=0, help="seed of random-init weights")
    parser.add_argument(
        "--threshold", type=float, default=RANK_THRESHOLD, help=f"numerical-rank threshold (default: {RANK_THRESHOLD})"
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    parser.add_argument("--title", help="plot title (default: image count and token count)")
    parser.add_argument("--no-progress", action="store_true")
    add_threads_argument(parser)
    args = parser.parse_args(argv)

    # --help, usage errors and missing files come at once, before torch is imported
    *checkpoints, images = args.paths
    configs = [source for kind, source in args.sources or [] if kind == "config"]
    files = {f"checkpoint {i + 1}": path for i, path in enumerate(checkpoints)}
    files.update({f"--config {i + 1}": path for i, path in enumerate(configs)})
    if error := input_error(files, {"IMAGES": images}):
        return refuse(error)
    apply_threads(args.threads)
    from wsss.analysis.diagnose import (
        diagnose_folder,
        model_from_checkpoint_file,
        model_from_config,
        model_from_timm,
        plot_layers,
        write_layers_csv,
    )

    sources = [("checkpoint", str(p)) for p in checkpoints] + (args.sources or [])
    if not sources:
        parser.error("give at least one model (CHECKPOINT ..., --timm NAME or --config FILE) and then IMAGES")
    labels = args.label or [default_label(kind, source) for kind, source in sources]
    if len(labels) != len(sources) or len(set(labels)) != len(labels):
        parser.error(f"need {len(sources)} distinct labels, one per model; got {labels}")
    pretrained = None if args.pretrained is None else "" if args.pretrained == "none" else args.pretrained
    try:
        models = {}
        for label, (kind, source) in zip(labels, sources, strict=True):
            if kind == "checkpoint":
                models[label] = model_from_checkpoint_file(source)
            elif kind == "config":
                models[label] = model_from_config(source, pretrained, seed=args.seed)
            else:
                models[label] = model_from_timm(source, "hub" if pretrained is None else pretrained, args.seed)
        result = diagnose_folder(models, images, args.size, args.max_images, args.threshold, args.device,
                                 progress=not args.no_progress)  # fmt: skip
    except (FileNotFoundError, ValueError, TypeError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    write_layers_csv(result.rows, args.out / "layers.csv")
    plot_layers(result.rows, args.out / "layers.png", title=args.title)
    for item in result.skipped:
        print(f"skipped {item.path}: {item.reason}")
    print(f"{len(models)} model(s) x {len(result.images)} image(s) ({len(result.skipped)} skipped); wrote "
          f"{args.out / 'layers.csv'} ({len(result.rows)} rows) and {args.out / 'layers.png'}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
