"""From nothing to the paper's tables in one command: prepare, train, test, pseudo labels, report (make reproduce).

    python tools/reproduce.py voc [--data-root ROOT] [--archives DIR] [--mirror URL] [--checksums FILE] [--work-dir DIR]
        [--config FILE] [--cfg-options k=v ...] [--device cuda|cpu] [--quiet]
    python tools/reproduce.py toy [--data-root ROOT] [--num-train N] [--num-val N] [...]

Stages (wsss/reproduce.py), each the tool's own command:
  1. prepare   voc: tools/prepare_data.py voc ROOT -> ROOT/VOCdevkit/VOC2012 (--archives, --mirror, --checksums
               passed on); toy: tools/make_toy_voc.py ROOT/toy_voc and tools/make_cls_labels.py, as make demo
  2. train     tools/train.py CONFIG --resume (configs/voc_centered.py; toy: configs/toy_centered.py)
  3. test      tools/test.py CONFIG CKPT --tta --crf: val mIoU, multi-scale + flip + dense CRF (Tables 1-2)
  4. pseudo    tools/eval_cams.py CKPT --split train --pseudo: pseudo labels on train (Table 3)
  5. report    tools/report.py WORK_DIR -> WORK_DIR/report.md and report.json
CKPT is WORK_DIR/iter_<train.max_iters>.pth; WORK_DIR is --work-dir, else the config's work_dir
(work_dirs/voc_centered). --cfg-options go to train and test; data.root is set to the prepared dataset.

Each stage prints its start and its seconds when done; the end prints a table of stage times, also kept in
WORK_DIR/reproduce.json. A re-run skips the finished stages (the record holds them with the same settings and their
outputs exist) and resumes at the first one that is not: an interrupted training continues from its newest
checkpoint. A failing stage stops the chain with one line naming it, the command to rerun and its log
(WORK_DIR/reproduce_logs/); so does a record that cannot be written (a read-only WORK_DIR, a full disk). Ctrl-C stops
the running stage and prints where the chain stopped and how to resume it, without a traceback.
Exit 0: the report is written; 1: a stage failed or the record cannot be written; 2: a bad argument; 130: Ctrl-C.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

from wsss.utils.lifetime import exit_on_sigterm

INTERRUPTED = 130
"""The exit status after Ctrl-C: 128 + SIGINT, as a shell reports a process that SIGINT ended."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dataset", choices=("voc", "toy"), help="voc: the paper's chain; toy: the CPU demo's")
    parser.add_argument("--data-root", type=Path, default=Path("data"), help="ROOT of the data (default: data)")
    parser.add_argument("--work-dir", type=Path, help="checkpoints, results, report (default: the config's)")
    parser.add_argument("--config", help="the config to train (default: configs/voc_centered.py or toy_centered.py)")
    parser.add_argument("--cfg-options", nargs="+", default=[], metavar="KEY=VALUE", help="for train and test")
    parser.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda when available")
    parser.add_argument("--archives", type=Path, metavar="DIR", help="voc: the archives you already have")
    parser.add_argument("--mirror", metavar="URL", help="voc: download URL/<archive name>")
    parser.add_argument("--checksums", type=Path, metavar="FILE", help="voc: MD5s to check ('<md5>  <name>' lines)")
    parser.add_argument("--num-train", type=int, help="toy: train images (default: make_toy_voc.py's)")
    parser.add_argument("--num-val", type=int, help="toy: val images (default: make_toy_voc.py's)")
    parser.add_argument("--quiet", action="store_true", help="the stages' output to their logs only")
    args = parser.parse_args(argv)

    # after parsing: --help and usage errors come at once
    from wsss.config import ConfigError
    from wsss.reproduce import plan_chain, run_chain, run_command

    try:
        chain = plan_chain(args.dataset, args.data_root, work_dir=args.work_dir, config=args.config,
                           cfg_options=args.cfg_options, device=args.device, archives=args.archives,
                           mirror=args.mirror, checksums=args.checksums, num_train=args.num_train,
                           num_val=args.num_val)  # fmt: skip
        return run_chain(chain, partial(run_command, echo=not args.quiet)).returncode
    except (ConfigError, FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # run_chain printed where the chain stopped and how to resume it
        return INTERRUPTED


if __name__ == "__main__":
    exit_on_sigterm()  # SIGTERM unwinds like Ctrl-C: the running stage is stopped and recorded as interrupted
    raise SystemExit(main())
