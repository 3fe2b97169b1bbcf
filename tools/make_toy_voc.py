"""Generate the synthetic toy dataset in PASCAL VOC layout (the default data of ``make demo`` and tests).

Example:
    python tools/make_toy_voc.py data/toy_voc --num-train 400 --num-val 100 --seed 0
    python tools/make_toy_voc.py data/toy_voc_v3 --version 3    # class = shape and fill, colours shared
"""

from __future__ import annotations

import argparse
import sys
import time

from wsss.data.toy.render import DEFAULT_TOY_VERSION, TOY_CLASSES, TOY_VERSIONS


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "out_dir", help="output folder (created; left as is when already complete; refused when it holds other files)"
    )
    parser.add_argument("--num-train", type=int, default=400, help="number of train images")
    parser.add_argument("--num-val", type=int, default=100, help="number of val images")
    parser.add_argument("--seed", type=int, default=0, help="random seed; same seed, same bytes")
    parser.add_argument(
        "--version",
        type=int,
        choices=TOY_VERSIONS,
        default=DEFAULT_TOY_VERSION,
        help="generator version: 2 = a hue per class (the demo's), 3 = shape and fill only, colours shared "
        "by all classes (docs/toy_dataset.md)",
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="write into a folder that holds other files (its splits are replaced)"
    )
    parser.add_argument("--sheet", default=None, help="also write a PNG of the first 8 train images beside their masks")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    # after parsing: --help and usage errors come at once
    from wsss.data.toy.dataset import make_toy_voc, save_contact_sheet, toy_voc_is_complete

    if args.num_train < 1 or args.num_val < 1:
        print(f"error: need --num-train and --num-val >= 1, got {args.num_train} and {args.num_val}")
        return 2
    fresh = not toy_voc_is_complete(args.out_dir, args.num_train, args.num_val, args.seed, args.version)
    start = time.perf_counter()
    try:
        root = make_toy_voc(
            args.out_dir, args.num_train, args.num_val, args.seed, args.version, args.overwrite, progress=True
        )
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    took = f"generated in {time.perf_counter() - start:.1f} s" if fresh else "already complete, kept"
    if args.sheet:
        ids = (root / "ImageSets" / "Segmentation" / "train.txt").read_text().split()[:8]
        save_contact_sheet(root, args.sheet, ids)
    print(
        f"toy VOC: {args.num_train} train + {args.num_val} val images, {len(TOY_CLASSES)} classes "
        f"(version {args.version}, seed {args.seed}) in {root}: {took}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
