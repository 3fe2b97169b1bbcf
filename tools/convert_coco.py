"""Convert MS COCO 2014 instance annotations into semantic masks, split files and image-level labels.

    python tools/convert_coco.py COCO_ROOT [--ann-dir DIR] [--splits train val] [--val-part 5000] [--overwrite]

COCO_ROOT holds train2014/ and val2014/ (the images) and annotations/instances_{train,val}2014.json.
Writes SegmentationClass/, ImageSets/Segmentation/{train,val,val_part}.txt, cls_labels.json and classes.txt
under COCO_ROOT (81 classes, background 0; 255 where instances of different classes overlap and on crowd
regions: see wsss/data/prepare/coco.py). Re-running resumes: existing masks are kept unless --overwrite.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from wsss.config import DataConfig
from wsss.data.prepare.coco import SPLITS, convert_coco


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", type=Path, help="COCO 2014 root (train2014/, val2014/, annotations/)")
    parser.add_argument("--ann-dir", type=Path, help="folder of instances_*2014.json (default: ROOT/annotations)")
    parser.add_argument("--splits", nargs="+", choices=SPLITS, default=list(SPLITS))
    parser.add_argument("--val-part", type=int, default=5000, help="length of the val_part split (0: none)")
    parser.add_argument("--ignore-index", type=int, default=DataConfig.ignore_index,
                        help="value of class overlaps and crowd regions")
    parser.add_argument("--overwrite", action="store_true", help="decode again masks that exist")
    args = parser.parse_args(argv)
    try:
        summary = convert_coco(
            args.root, args.ann_dir, tuple(args.splits), args.val_part, args.ignore_index, args.overwrite
        )
    except (FileNotFoundError, ValueError, ImportError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    sizes = ", ".join(f"{k} {v}" for k, v in summary.split_sizes.items())
    print(f"wrote {summary.written} masks ({summary.existing} existed); split files: {sizes}; under {args.root}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
