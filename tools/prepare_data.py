"""Download, check, unpack and convert PASCAL VOC 2012 + SBD, or MS COCO 2014, into the layout the configs read.

    python tools/prepare_data.py voc [ROOT] [--archives DIR] [--mirror URL] [--checksums FILE]
    python tools/prepare_data.py coco [ROOT] ...

ROOT (default data) gets VOCdevkit/VOC2012 (configs/voc_centered.py) and benchmark_RELEASE, or coco/
(configs/coco_centered.py). Archives are taken from --archives DIR when there (read in place), else downloaded
into ROOT/downloads from the official addresses or --mirror URL (URL/<archive name>); an interrupted download
resumes. Each archive is checked against its published MD5 (VOC, SBD) or its size (COCO publishes no checksum;
--checksums FILE, in md5sum's format, gives MD5s to check instead). Then: unpack, convert_sbd / convert_coco,
the image-level labels, check_dataset. A re-run skips the finished steps.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from wsss.utils.startup import input_error, refuse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dataset", choices=("voc", "coco"))
    parser.add_argument("root", type=Path, nargs="?", default=Path("data"), help="the data folder (default: data)")
    parser.add_argument("--archives", type=Path, metavar="DIR", help="folder of archives you already have")
    parser.add_argument("--mirror", metavar="URL", help="download URL/<archive name> instead of the official address")
    parser.add_argument("--checksums", type=Path, metavar="FILE", help="MD5s to check ('<md5>  <name>' lines)")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds before a silent server is given up")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)

    # --help, usage errors and missing files come at once, before torch is imported
    if error := input_error({"--checksums": args.checksums}, {"--archives": args.archives}):
        return refuse(error)
    from wsss.data.download import FetchOptions, PrepareError, read_checksums
    from wsss.data.prepare import DATASETS, prepare

    opts = FetchOptions(archive_dir=args.archives, mirror=args.mirror, connect_timeout=args.timeout,
                        progress=not args.no_progress)  # fmt: skip
    try:
        if args.archives is not None and not args.archives.is_dir():
            raise PrepareError(f"--archives {args.archives}: no such folder")
        archives = DATASETS[args.dataset].archives
        if args.checksums is not None:
            archives = read_checksums(args.checksums, archives)
        prepare(args.dataset, args.root, archives, opts)
    except (PrepareError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
