"""Write the image-level label file of a VOC-layout dataset from its XML annotations or its masks.

    python tools/make_cls_labels.py VOC_ROOT [--source xml|masks] [--classes FILE] [--out FILE]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from wsss.data.classes import VOC_CLASSES, load_classes
from wsss.data.labels import labels_from_masks, labels_from_xml, save_labels


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", type=Path, help="dataset root (holds Annotations/ or the mask folder)")
    parser.add_argument("--source", choices=("xml", "masks"), default="xml")
    parser.add_argument("--classes", help="class list file, background first (default: the 21 VOC classes)")
    parser.add_argument("--mask-dir", default="SegmentationClassAug", help="mask folder for --source masks")
    parser.add_argument("--out", type=Path, help="output file (default: ROOT/cls_labels.json)")
    args = parser.parse_args(argv)

    out = args.out or args.root / "cls_labels.json"
    try:
        classes = load_classes(args.classes) if args.classes else list(VOC_CLASSES)
        if args.source == "xml":
            labels = labels_from_xml(args.root / "Annotations", classes)
        else:
            labels = labels_from_masks(args.root / args.mask_dir, len(classes))
        save_labels(out, labels, classes)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote labels of {len(labels)} images over {len(classes) - 1} foreground classes to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
