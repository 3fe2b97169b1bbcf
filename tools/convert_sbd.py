"""Convert SBD class masks to PNG in VOC_ROOT/SegmentationClassAug and write the train_aug split.

    python tools/convert_sbd.py SBD_ROOT VOC_ROOT
"""

from __future__ import annotations

import argparse
import sys

from wsss.utils.startup import input_error, refuse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sbd_root", help="unpacked SBD (benchmark_RELEASE, or its dataset/ folder)")
    parser.add_argument("voc_root", help="VOC2012 root (holds JPEGImages/, SegmentationClass/, ImageSets/)")
    parser.add_argument("--out-dir", default="SegmentationClassAug", help="mask folder to write under VOC_ROOT")
    args = parser.parse_args(argv)

    # --help, usage errors and a missing VOC_ROOT come at once, before torch is imported (a wrong SBD_ROOT is named
    # with the download to fetch by convert_sbd)
    if error := input_error({}, {"VOC_ROOT": args.voc_root}):
        return refuse(error)
    from wsss.data.prepare.sbd import convert_sbd

    try:
        counts = convert_sbd(args.sbd_root, args.voc_root, out_dir=args.out_dir)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(
        f"converted {counts['sbd']} SBD masks, copied {counts['voc']} VOC masks, "
        f"{counts['images_copied']} images copied; train_aug.txt lists {counts['train_aug']} ids"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
