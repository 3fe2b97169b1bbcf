"""Download, check, unpack and convert PASCAL VOC 2012 + SBD, or MS COCO 2014, into the layout the configs read.

    python tools/prepare_data.py voc [ROOT] [--archives DIR] [--mirror URL] [--checksums FILE]
    python tools/prepare_data.py coco [ROOT] ...

ROOT (default data) gets VOCdevkit/VOC2012 (configs/voc_centered.py) and benchmark_RELEASE, or coco/
(configs/coco_centered.py). Archives are taken from --archives DIR when there (read in place), else downloaded
into ROOT/downloads from the official addresses or --mirror URL (URL/<archive name>); an interrupted download
resumes. Each archive is checked against its published MD5 (VOC, SBD) or its size (COCO publishes no checksum;
--checksums FILE, in md5sum's format, gives MD5s to check instead). Then: unpack, convert_sbd / convert_coco,
the image-level labels, check_dataset. A re-run skips the finished steps; after Ctrl-C or an error, run the same
command again to go on.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

from wsss.data.prepare.download import MAX_TIMEOUT_S, FetchOptions, PrepareError, mirror_problem, read_checksums
from wsss.utils.startup import input_error, refuse

DEFAULTS = FetchOptions()
BOUNDS = (
    f"Bounds: {DEFAULTS.min_free_bytes / 2**30:g} GiB stays free on ROOT's disk (checked before each download and "
    "extraction, then before every write and every member unpacked); a download never grows past the archive's known "
    f"size; each read waits at most --timeout seconds, and a download averaging under {DEFAULTS.min_bytes_per_s:,} "
    f"bytes/s over {DEFAULTS.rate_window_s:g} s is given up (what arrived is kept, a re-run resumes it)."
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, epilog=textwrap.fill(BOUNDS, 116),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("dataset", choices=("voc", "coco"))
    parser.add_argument("root", type=Path, nargs="?", default=Path("data"), help="the data folder (default: data)")
    parser.add_argument("--archives", type=Path, metavar="DIR", help="folder of archives you already have")
    parser.add_argument("--mirror", metavar="URL", help="download URL/<archive name> instead of the official address")
    parser.add_argument("--checksums", type=Path, metavar="FILE", help="MD5s to check ('<md5>  <name>' lines)")
    parser.add_argument("--timeout", type=float, default=DEFAULTS.timeout, metavar="SECONDS",
                        help="seconds a connection, and each read of a download, waits for a silent server (default: "
                        "%(default)g)")  # fmt: skip
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)

    # --help, usage errors and wrong options or files come at once, before torch is imported
    if error := input_error({"--checksums": args.checksums}, {"--archives": args.archives}):
        return refuse(error)
    if not 0 < args.timeout <= MAX_TIMEOUT_S:  # NaN fails too
        return refuse(f"--timeout {args.timeout}: give the seconds to wait for a silent server, more than 0 and at "
                      f"most {MAX_TIMEOUT_S:g}, e.g. --timeout 30")  # fmt: skip
    if args.mirror is not None and (why := mirror_problem(args.mirror)):
        return refuse(f"--mirror {args.mirror!r}: {why}; give the address that serves URL/<archive name>, e.g. "
                      "--mirror https://host/voc")  # fmt: skip
    opts = FetchOptions(archive_dir=args.archives, mirror=args.mirror, timeout=args.timeout,
                        progress=not args.no_progress)  # fmt: skip
    try:
        from wsss.data.prepare.pipeline import DATASETS, prepare

        archives = DATASETS[args.dataset].archives
        if args.checksums is not None:
            archives = read_checksums(args.checksums, archives)
        prepare(args.dataset, args.root, archives, opts)
    except (PrepareError, OSError) as err:
        return refuse(str(err))
    except KeyboardInterrupt:
        print("error: interrupted (Ctrl-C); run the same command again: finished steps are skipped and a download "
              "resumes from its .part file", file=sys.stderr)  # fmt: skip
        return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
