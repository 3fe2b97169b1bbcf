"""The paper's Tables 1-3 from a work dir: report.md and report.json, ours beside the paper's and ToCo's rows.

    python tools/report.py WORK_DIR [WORK_DIR ...] [--out DIR] [--test-miou MIOU [--submission DIR]]

Reads what tools/test.py (metrics.json; submission.json with --format-only) and tools/eval_cams.py --pseudo
(cam_eval.json) wrote in each WORK_DIR and its subfolders:
  Table 1  segmentation mIoU on val, and on test once the VOC server scored the archive of a test-split
           --format-only run (--test-miou; refused without one)
  Table 2  per-class IoU of every scored run
  Table 3  pseudo labels: mIoU with every pixel scored and on the certain pixels only, with the uncertain share
Every row of ours prints the protocol its file records (scales, flip, CRF, mask_classes, split and its size,
whether it is the full val set, checkpoint step). With VOC's classes each table also shows the paper's row and
ToCo's published row (wsss/evaluation/paper_tables.py, with their sources) and our difference to each; a number
the sources do not write stays an empty cell. Other class lists get our rows only.

Outputs: DIR/report.md and DIR/report.json (default DIR: the first WORK_DIR); the markdown is also printed. A result
file that is not what its tool writes (not JSON, not an object, a score missing or not a number, a named pipe) stops
the report with one error line naming the file and the tool that rewrites it; so does an output it cannot write.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("work_dirs", nargs="+", type=Path, metavar="WORK_DIR", help="where test.py/eval_cams.py wrote")
    parser.add_argument("--out", type=Path, help="folder of report.md and report.json (default: the first WORK_DIR)")
    parser.add_argument("--test-miou", type=float, help="the mIoU the VOC server returned for the archive of a "
                        "test-split --format-only run")
    parser.add_argument("--submission", type=Path, help="the test run the server scored, when there are several")
    args = parser.parse_args(argv)

    from wsss.evaluation.report import build_report, write_report

    try:
        report = build_report(args.work_dirs, args.test_miou, args.submission)
        md, js = write_report(report, args.out or args.work_dirs[0])
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(report.to_markdown())
    print(f"wrote {md} and {js}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
