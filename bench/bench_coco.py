"""Benchmark tools/convert_coco.py's conversion on a synthetic COCO-format annotation file: time per image and
peak memory, at several image counts (peak memory should grow with the annotation index, not with the masks).

Each count runs in a fresh process. Images are 640x480 (COCO's typical size) with ``--instances`` polygon
instances of random classes (overlapping) and one crowd RLE region each; the 80 COCO category ids are used.

    python bench/bench_coco.py [--counts 500 2000] [--instances 7] [--dir KEEP_DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import rss_bytes

from wsss.data.prepare.coco import convert_coco

H, W = 480, 640
CATEGORY_IDS = [i for i in range(1, 91) if i not in (12, 26, 29, 30, 45, 66, 68, 69, 71, 83)]  # COCO's 80


def synthetic_coco(num: int, instances: int, seed: int = 0) -> dict:
    """A COCO instances file of ``num`` images: random polygons and one uncompressed-RLE crowd per image."""
    rng = np.random.default_rng(seed)
    images, anns = [], []
    crowd = np.zeros((H, W), np.uint8)
    crowd[400:460, 20:200] = 1
    flat = crowd.flatten(order="F")
    changes = np.flatnonzero(np.diff(np.concatenate([[0], flat, [1 - flat[-1]]])))
    crowd_rle = {"size": [H, W], "counts": np.diff(np.concatenate([[0], changes])).tolist()}
    for i in range(1, num + 1):
        images.append({"id": i, "file_name": f"COCO_train2014_{i:012d}.jpg", "height": H, "width": W})
        for _ in range(instances):
            cx, cy, r = rng.uniform(50, W - 50), rng.uniform(50, H - 50), rng.uniform(20, 120)
            angles = np.sort(rng.uniform(0, 2 * np.pi, 12))
            poly = np.stack([cx + r * np.cos(angles), cy + r * np.sin(angles)], 1).clip(0, [W - 1, H - 1])
            anns.append({"id": len(anns) + 1, "image_id": i, "category_id": int(rng.choice(CATEGORY_IDS)),
                         "iscrowd": 0, "segmentation": [poly.ravel().round(1).tolist()]})  # fmt: skip
        anns.append({"id": len(anns) + 1, "image_id": i, "category_id": 1, "iscrowd": 1, "segmentation": crowd_rle})
    return {"images": images, "annotations": anns, "categories": [{"id": c, "name": f"c{c}"} for c in CATEGORY_IDS]}


def measure(root: Path) -> None:
    """Run in a child process: convert ``root`` and print seconds and peak RSS as JSON."""
    tic = time.perf_counter()
    summary = convert_coco(root, None, ("train",), 0, 255, progress=False)
    print(json.dumps({"seconds": time.perf_counter() - tic, "peak_rss": rss_bytes("VmHWM"), "masks": summary.written}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--counts", type=int, nargs="+", default=[500, 2000])
    parser.add_argument("--instances", type=int, default=7)
    parser.add_argument("--dir", type=Path, help="keep the generated data here")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        measure(args.child)
        return
    base = args.dir or Path(tempfile.mkdtemp(prefix="bench_coco_"))
    print(f"{'images':>7} {'ann MB':>7} {'s/image':>8} {'peak RSS MB':>12}")
    for num in args.counts:
        root = base / f"n{num}"
        (root / "annotations").mkdir(parents=True, exist_ok=True)
        ann = root / "annotations" / "instances_train2014.json"
        ann.write_text(json.dumps(synthetic_coco(num, args.instances)))
        cmd = [sys.executable, __file__, "--child", str(root)]
        res = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.splitlines()[-1])
        mb = ann.stat().st_size / 2**20
        print(f"{num:>7} {mb:>7.1f} {res['seconds'] / num:>8.4f} {res['peak_rss'] / 2**20:>12.0f}")


if __name__ == "__main__":
    main()
