"""Write the image-level label file of a VOC-layout dataset from its XML annotations or its masks.

    python tools/make_cls_labels.py --config CONFIG [--source xml|masks]
    python tools/make_cls_labels.py ROOT [--source xml|masks] [--classes FILE] [--mask-dir DIR] [--out FILE]

With --config, the root, the classes, the mask folder and the label file are the config's data.* values (the
options given beside it win). With --source masks and no mask folder named (or the named one missing), the
first of SegmentationClassAug/ and SegmentationClass/ that holds PNGs is used.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from wsss.config import ConfigError, DataConfig, load_config
from wsss.data.classes import load_classes
from wsss.data.labels import make_label_file, under_root


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", type=Path, nargs="?", help="dataset root (default: the config's data.root)")
    parser.add_argument("--config", help="read data.root, classes, mask_dir and label_file from this config")
    parser.add_argument("--source", choices=("xml", "masks"), default="xml")
    parser.add_argument("--classes", help="class list file, background first (default: the config's, else VOC's)")
    parser.add_argument("--mask-dir", help="mask folder under ROOT (default: the config's, else found)")
    parser.add_argument("--out", type=Path, help="output file (default: data.label_file, ROOT/cls_labels.json)")
    args = parser.parse_args(argv)
    if args.root is None and args.config is None:
        parser.error("give the dataset ROOT or --config")
    try:
        # without a config: the 21 VOC classes, ROOT/cls_labels.json, the mask folder found under ROOT
        data = load_config(args.config).data if args.config else DataConfig(mask_dir="")
        if data.layout == "tags":
            raise ValueError(f"{args.config} uses the tags layout: training reads its tags file, no label file is made")
        root = args.root or Path(data.root)
        classes = args.classes or data.classes
        if classes is None:
            raise ValueError(f"{args.config}: data.classes is unset; give --classes FILE")
        classes = load_classes(under_root(root, classes) if isinstance(classes, str) else classes)
        out = args.out or under_root(root, data.label_file)
        count, folder = make_label_file(root, args.source, classes, out, args.mask_dir or data.mask_dir or None,
                                        data.ignore_index)  # fmt: skip
    except (FileNotFoundError, ValueError, ConfigError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote labels of {count} images over {len(classes) - 1} foreground classes (from {folder}) to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
