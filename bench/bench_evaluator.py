"""Benchmark the wsss evaluator against mmseg's IoUMetric, in one process, on VOC-val-shaped PNG masks.

Writes ``--num`` pairs of structured random masks (``--height`` x ``--width``, objects with 255 boundaries;
predictions are jittered, partly mislabelled copies) to a temporary folder, then times:
  decode   the floor: reading every PNG pair with ``wsss.utils.fileio.read_mask``, serially and with the thread pool
  metric   the metric alone on decoded arrays: ConfusionMatrix.update + compute vs
           IoUMetric.process + evaluate
  e2e      end to end from the folders: ``evaluate_folders`` vs a serial loop of mmcv.imfrombytes (mmseg's
           LoadAnnotations decoder) + IoUMetric.process + evaluate
Each timing is the best of ``--repeats`` runs (wall clock and process CPU time).

    python bench/bench_evaluator.py [--num 1449] [--device cpu|cuda] [--workers 4] [--repeats 3]
        [--torch-threads N] [--dir KEEP_DIR]
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from wsss.data.classes import voc_palette
from wsss.evaluation.folders import evaluate_folders, index_masks, iter_mask_pairs
from wsss.evaluation.metrics import ConfusionMatrix, format_table
from wsss.utils.fileio import read_mask, save_mask


def make_pair(rng: np.random.Generator, h: int, w: int, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """A (pred, gt) pair of uint8 masks: 1-4 ellipses/boxes on background, 255 bands on the gt boundaries."""
    yy, xx = np.mgrid[0:h, 0:w]
    gt = np.zeros((h, w), np.uint8)
    pred = np.zeros((h, w), np.uint8)
    for _ in range(rng.integers(1, 5)):
        c = int(rng.integers(1, num_classes))
        cy, cx = rng.uniform(0, h), rng.uniform(0, w)
        ry, rx = rng.uniform(0.08, 0.35) * h, rng.uniform(0.08, 0.35) * w
        dy, dx = rng.normal(0, 0.05 * h), rng.normal(0, 0.05 * w)  # the prediction is shifted and rescaled
        s = rng.uniform(0.8, 1.2)
        pc = c if rng.random() < 0.8 else int(rng.integers(1, num_classes))
        if rng.random() < 0.5:
            gt[((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 <= 1] = c
            pred[((yy - cy - dy) / (s * ry)) ** 2 + ((xx - cx - dx) / (s * rx)) ** 2 <= 1] = pc
        else:
            gt[(abs(yy - cy) <= ry) & (abs(xx - cx) <= rx)] = c
            pred[(abs(yy - cy - dy) <= s * ry) & (abs(xx - cx - dx) <= s * rx)] = pc
    edge = np.zeros((h, w), bool)
    edge[1:] |= gt[1:] != gt[:-1]
    edge[:, 1:] |= gt[:, 1:] != gt[:, :-1]
    for _ in range(2):  # widen the boundary to ~5 px, as VOC's void band
        edge[1:] |= edge[:-1].copy()
        edge[:, 1:] |= edge[:, :-1].copy()
    gt[edge] = 255
    return pred, gt


def write_dataset(root: Path, num: int, h: int, w: int, num_classes: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    palette = voc_palette()
    for i in range(num):
        pred, gt = make_pair(rng, h, w, num_classes)
        save_mask(root / "gt" / f"{i:06d}.png", gt, palette)
        save_mask(root / "pred" / f"{i:06d}.png", pred, palette)


def best_of(fn: Callable[[], object], repeats: int) -> tuple[float, float, object]:
    """(best wall seconds, process CPU seconds of that run, last result)."""
    best = (float("inf"), float("inf"), None)
    for _ in range(repeats):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        if wall < best[0]:
            best = (wall, cpu, out)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--num", type=int, default=1449)
    parser.add_argument("--height", type=int, default=375)
    parser.add_argument("--width", type=int, default=500)
    parser.add_argument("--num-classes", type=int, default=21)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--workers", type=int, default=4, help="decoding threads of evaluate_folders")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--torch-threads", type=int, help="torch.set_num_threads (default: torch's choice)")
    parser.add_argument("--dir", type=Path, help="reuse/keep the generated masks here (default: a temp dir)")
    args = parser.parse_args(argv)

    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    import mmcv
    from mmengine.logging import MMLogger
    from mmseg.evaluation import IoUMetric

    MMLogger.get_current_instance().setLevel(logging.WARNING)  # the per-class table print is not timed noise
    tmp = None if args.dir else tempfile.TemporaryDirectory(prefix="bench_eval_")
    root = args.dir or Path(tmp.name)
    if len(index_masks(root / "gt") if (root / "gt").is_dir() else {}) != args.num:
        t0 = time.perf_counter()
        write_dataset(root, args.num, args.height, args.width, args.num_classes, args.seed)
        print(f"wrote {args.num} mask pairs to {root} in {time.perf_counter() - t0:.1f} s")
    names = sorted(index_masks(root / "gt"))
    paths = [(k, root / "pred" / f"{k}.png", root / "gt" / f"{k}.png") for k in names]
    device, c, n = torch.device(args.device), args.num_classes, len(names)
    classes = [str(i) for i in range(c)]

    def decode_serial():
        return [(read_mask(p), read_mask(g)) for _, p, g in paths]

    def decode_threads():
        return [(p, g) for _, p, g in iter_mask_pairs(paths, args.workers)]

    t_dec, cpu_dec, arrays = best_of(decode_serial, args.repeats)
    t_dec_par, cpu_dec_par, _ = best_of(decode_threads, args.repeats)

    def ours_metric():
        cm = ConfusionMatrix(c, device=device)
        for pred, gt in arrays:
            cm.update(torch.from_numpy(pred).to(device), torch.from_numpy(gt).to(device))
        result = cm.compute(class_names=classes)
        format_table(result)
        return result.summary

    def mmseg_metric():
        metric = IoUMetric()
        metric.dataset_meta = dict(classes=classes)
        for pred, gt in arrays:
            sample = dict(
                pred_sem_seg=dict(data=torch.from_numpy(pred)[None].to(device)),
                gt_sem_seg=dict(data=torch.from_numpy(gt)[None].to(device)),
            )
            metric.process({}, [sample])
        return {k: float(v) for k, v in metric.evaluate(n).items()}

    def ours_e2e():
        return evaluate_folders(
            root / "pred", root / "gt", c, device=device, num_workers=args.workers
        ).summary

    def ours_e2e_serial():
        return evaluate_folders(root / "pred", root / "gt", c, device=device, num_workers=0).summary

    def mmseg_e2e():
        metric = IoUMetric()
        metric.dataset_meta = dict(classes=classes)
        for _, p, g in paths:
            pred = mmcv.imfrombytes(p.read_bytes(), flag="unchanged", backend="pillow").squeeze()
            gt = mmcv.imfrombytes(g.read_bytes(), flag="unchanged", backend="pillow").squeeze()
            sample = dict(
                pred_sem_seg=dict(data=torch.from_numpy(pred)[None].to(device)),
                gt_sem_seg=dict(data=torch.from_numpy(gt)[None].to(device)),
            )
            metric.process({}, [sample])
        return {k: float(v) for k, v in metric.evaluate(n).items()}

    rows = {}
    for name, fn in [
        ("metric: wsss ConfusionMatrix", ours_metric),
        ("metric: mmseg IoUMetric", mmseg_metric),
        (f"e2e: wsss evaluate_folders ({args.workers} threads)", ours_e2e),
        ("e2e: wsss evaluate_folders (serial)", ours_e2e_serial),
        ("e2e: mmcv decode + mmseg IoUMetric", mmseg_e2e),
    ]:
        rows[name] = best_of(fn, args.repeats)
    summaries = {name: r[2] for name, r in rows.items()}
    reference = summaries["metric: mmseg IoUMetric"]
    for name, s in summaries.items():
        assert all(abs(s[k] - reference[k]) < 1e-4 for k in reference), (name, s, reference)

    print(
        f"\n{n} pairs of {args.width}x{args.height}, {c} classes, device {args.device}, "
        f"torch threads {torch.get_num_threads()}, {os.cpu_count()} CPUs ({platform.processor() or 'cpu'}), "
        f"load avg {os.getloadavg()[0]:.2f}; mIoU {reference['mIoU']:.2f} (identical for all rows)\n"
    )
    print("| what | wall s | CPU s | wall / serial decode |")
    print("|---|---:|---:|---:|")
    print(f"| decode floor: read_mask, serial | {t_dec:.2f} | {cpu_dec:.2f} | 1.00 |")
    print(f"| decode floor: read_mask, {args.workers} threads | {t_dec_par:.2f} | {cpu_dec_par:.2f} "
          f"| {t_dec_par / t_dec:.2f} |")  # fmt: skip
    for name, (wall, cpu, _) in rows.items():
        print(f"| {name} | {wall:.2f} | {cpu:.2f} | {wall / t_dec:.2f} |")
    m_ours, m_mm = rows["metric: wsss ConfusionMatrix"], rows["metric: mmseg IoUMetric"]
    print(
        f"\nmetric alone: mmseg / wsss = {m_mm[0] / m_ours[0]:.1f}x wall, {m_mm[1] / m_ours[1]:.1f}x CPU; "
        f"per image {1e3 * m_ours[0] / n:.2f} ms vs {1e3 * m_mm[0] / n:.2f} ms"
    )
    e_ours = rows[f"e2e: wsss evaluate_folders ({args.workers} threads)"][0]
    e_mm = rows["e2e: mmcv decode + mmseg IoUMetric"][0]
    print(
        f"end to end: mmseg / wsss = {e_mm / e_ours:.2f}x; wsss / serial decode floor = {e_ours / t_dec:.2f}"
    )
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
