"""The confusion-matrix evaluator: equality with mmseg's IoUMetric, hand-computed values, the CLI, DDP."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.fake_cuda import fake_cuda, needs_fake_cuda
from wsss.evaluation.metrics import ConfusionMatrix, _count_numpy, _count_torch, format_table

ALL_METRICS = ["mIoU", "mDice", "mFscore"]


def mmseg_reduce_zero_label(gt: np.ndarray) -> np.ndarray:
    """What mmseg's LoadAnnotations(reduce_zero_label=True) does to a uint8 mask (mmseg.datasets needs ftfy,
    which the environment lacks, so the three documented steps are reproduced here)."""
    gt = gt.copy()
    gt[gt == 0] = 255
    gt = gt - 1
    gt[gt == 254] = 255
    return gt


def run_mmseg(pairs, num_classes, metrics=("mIoU",), nan_to_num=None, metric_type="IoUMetric"):
    """Rounded summary of an mmseg-registry metric and mmseg's unrounded per-class values (percent)."""
    from mmseg.evaluation import IoUMetric
    from mmseg.registry import METRICS

    metric = METRICS.build(dict(type=metric_type, iou_metrics=list(metrics), nan_to_num=nan_to_num))
    metric.dataset_meta = dict(classes=[f"c{i}" for i in range(num_classes)])
    for pred, gt in pairs:
        sample = dict(
            pred_sem_seg=dict(data=torch.as_tensor(pred)[None]),
            gt_sem_seg=dict(data=torch.as_tensor(gt)[None]),
        )
        metric.process({}, [sample])
    summary = {k: float(v) for k, v in metric.evaluate(len(pairs)).items()}
    areas = [
        IoUMetric.intersect_and_union(
            torch.as_tensor(p), torch.as_tensor(g).to(torch.as_tensor(p)), num_classes, 255
        )
        for p, g in pairs
    ]
    totals = [sum(a[i] for a in areas) for i in range(4)]
    per_class = IoUMetric.total_area_to_metrics(*totals, list(metrics), nan_to_num)
    per_class = {k: np.asarray(v, dtype=np.float64) * 100 for k, v in per_class.items() if k != "aAcc"}
    return summary, per_class


def run_ours(pairs, num_classes, metrics=("mIoU",), nan_to_num=None, reduce_zero_label=False, decimals=2):
    cm = ConfusionMatrix(num_classes, reduce_zero_label=reduce_zero_label)
    for pred, gt in pairs:
        cm.update(pred, gt)
    return cm.compute(metrics, nan_to_num=nan_to_num, decimals=decimals)


def assert_same(summary: dict, ours, mm_per_class: dict | None = None, ours_full=None) -> None:
    assert list(summary) == list(ours.summary)
    for key, value in summary.items():
        assert (math.isnan(value) and math.isnan(ours.summary[key])) or abs(
            value - ours.summary[key]
        ) < 1e-4, key
    if mm_per_class is not None:
        assert list(mm_per_class) == list(ours_full.per_class)
        for key, value in mm_per_class.items():
            np.testing.assert_allclose(
                ours_full.per_class[key], value, atol=1e-4, equal_nan=True, err_msg=key
            )


def random_pairs(seed: int, num_classes: int, n: int = 6):
    """Blocky predictions/labels of varied sizes with ignored pixels and out-of-range predictions."""
    rng = np.random.default_rng(seed)
    pairs = []
    for _ in range(n):
        h, w = rng.integers(20, 60, size=2)
        gt = np.kron(rng.integers(0, num_classes, size=(h // 4 + 1, w // 4 + 1)), np.ones((4, 4)))[:h, :w]
        gt = gt.astype(np.uint8)
        pred = np.where(rng.random((h, w)) < 0.6, gt, rng.integers(0, num_classes, size=(h, w))).astype(
            np.int64
        )
        gt[rng.random((h, w)) < 0.1] = 255
        pred[rng.random((h, w)) < 0.02] = 255
        pairs.append((pred, gt))
    return pairs


@pytest.mark.parametrize("seed,num_classes", [(0, 21), (1, 4), (2, 9)])
def test_matches_mmseg_on_random_inputs(seed: int, num_classes: int) -> None:
    pairs = random_pairs(seed, num_classes)
    summary, per_class = run_mmseg(pairs, num_classes, ALL_METRICS)
    assert_same(
        summary,
        run_ours(pairs, num_classes, ALL_METRICS),
        per_class,
        run_ours(pairs, num_classes, ALL_METRICS, decimals=None),
    )
    assert {"aAcc", "mIoU", "mAcc", "mDice", "mFscore", "mPrecision", "mRecall"} == set(summary)


@pytest.mark.filterwarnings("ignore:Mean of empty slice:RuntimeWarning")  # mmseg's nanmean of all-NaN
def test_matches_mmseg_on_edge_cases() -> None:
    c = 6  # class 4 only predicted (IoU 0, Acc NaN), class 5 nowhere (NaN)
    rng = np.random.default_rng(3)
    gt = rng.integers(0, 4, size=(16, 24)).astype(np.uint8)
    pred = gt.astype(np.int64).copy()
    pred[:4] = 4
    pred[-2:] = (pred[-2:] + 1) % 4
    all_ignore = (np.zeros((10, 12), np.int64), np.full((10, 12), 255, np.uint8))
    pairs = [(pred, gt), all_ignore]
    for metrics in (["mIoU"], ["mDice"], ALL_METRICS):
        summary, per_class = run_mmseg(pairs, c, metrics)
        assert_same(
            summary, run_ours(pairs, c, metrics), per_class, run_ours(pairs, c, metrics, decimals=None)
        )
    ours = run_ours(pairs, c, ["mIoU"])
    assert ours.per_class["IoU"][4] == 0 and math.isnan(ours.per_class["Acc"][4])
    assert math.isnan(ours.per_class["IoU"][5])
    # nan_to_num enters the means, as in mmseg
    summary, _ = run_mmseg(pairs, c, ["mIoU"], nan_to_num=0)
    assert_same(summary, run_ours(pairs, c, ["mIoU"], nan_to_num=0))
    # nothing but ignored pixels: every value is NaN in both
    summary, per_class = run_mmseg([all_ignore], c, ["mIoU"])
    ours = run_ours([all_ignore], c, ["mIoU"])
    assert_same(summary, ours, per_class, run_ours([all_ignore], c, ["mIoU"], decimals=None))
    assert all(math.isnan(v) for v in ours.summary.values())


def test_reduce_zero_label_matches_mmseg() -> None:
    rng = np.random.default_rng(4)
    raw_pairs = []
    for _ in range(3):
        gt = rng.integers(0, 6, size=(20, 30)).astype(np.uint8)  # 0 = "other", 1..5 = classes 0..4
        gt[rng.random(gt.shape) < 0.1] = 255
        pred = rng.integers(0, 5, size=gt.shape).astype(np.int64)
        raw_pairs.append((pred, gt))
    reduced = [(p, mmseg_reduce_zero_label(g)) for p, g in raw_pairs]
    summary, per_class = run_mmseg(reduced, 5, ALL_METRICS)
    ours = run_ours(raw_pairs, 5, ALL_METRICS, reduce_zero_label=True)
    full = run_ours(raw_pairs, 5, ALL_METRICS, reduce_zero_label=True, decimals=None)
    assert_same(summary, ours, per_class, full)
    cm = ConfusionMatrix(5, reduce_zero_label=True)
    cm.update(*raw_pairs[0])
    assert cm.num_ignored == int(((raw_pairs[0][1] == 0) | (raw_pairs[0][1] == 255)).sum())


def hand_example():
    gt = np.array([[0, 0, 1, 255], [1, 2, 2, 1], [0, 1, 2, 2]], dtype=np.uint8)
    pred = np.array([[0, 1, 1, 3], [1, 2, 0, 1], [3, 1, 255, 2]], dtype=np.uint8)
    return pred, gt


def test_hand_computed_example() -> None:
    # C = 5. Scored pixels (gt, pred), row by row:
    #   (0,0) (0,1) (1,1) | (1,1) (2,2) (2,0) (1,1) | (0,3) (1,1) (2,255) (2,2)
    # The ignored pixel predicts 3 and does not count. Class 3 is predicted once but absent from the ground
    # truth (IoU 0, Acc NaN); class 4 appears nowhere (NaN); 255 misses class 2, nobody's false positive.
    # tp = [1, 4, 2, 0, 0], gt area = [3, 4, 4, 0, 0], pred area = [2, 5, 2, 1, 0]
    pred, gt = hand_example()
    cm = ConfusionMatrix(5)
    cm.update(pred, gt)
    expected = np.zeros((5, 5), dtype=np.int64)
    for g, p in [(0, 0), (0, 1), (1, 1), (1, 1), (2, 2), (2, 0), (1, 1), (0, 3), (1, 1), (2, 2)]:
        expected[g, p] += 1
    np.testing.assert_array_equal(cm.matrix.numpy(), expected)
    assert cm.counts[2, 5] == 1 and cm.num_ignored == 1 and cm.num_out_of_range == 0

    r = cm.compute(ALL_METRICS, decimals=None)
    np.testing.assert_allclose(r.per_class["IoU"], [25, 80, 50, 0, np.nan], equal_nan=True)
    np.testing.assert_allclose(r.per_class["Acc"], [100 / 3, 100, 50, np.nan, np.nan], equal_nan=True)
    np.testing.assert_allclose(r.per_class["Dice"], [40, 800 / 9, 200 / 3, 0, np.nan], equal_nan=True)
    np.testing.assert_allclose(r.per_class["Precision"], [50, 80, 100, 0, np.nan], equal_nan=True)
    assert r.summary["mIoU"] == pytest.approx(38.75)
    assert r.summary["mAcc"] == pytest.approx(100 * 11 / 18)
    assert r.summary["aAcc"] == pytest.approx(100 * 7 / 11)
    assert r["mDice"] == pytest.approx(100 * (0.4 + 8 / 9 + 2 / 3) / 4)
    rounded = cm.compute()
    assert rounded.summary == {"aAcc": 63.64, "mIoU": 38.75, "mAcc": 61.11}
    assert list(rounded.per_class) == ["IoU", "Acc"]

    # a ground-truth label outside [0, C) that is not ignored is skipped (and counted), metrics unchanged
    gt_bad = gt.copy()
    gt_bad[0, 3] = 7
    cm2 = ConfusionMatrix(5)
    cm2.update(pred, gt_bad)
    assert cm2.num_out_of_range == 1 and cm2.num_ignored == 0
    assert cm2.compute().summary == rounded.summary


def test_input_types_shapes_and_merge() -> None:
    pred, gt = hand_example()
    reference = ConfusionMatrix(5)
    reference.update(pred, gt)
    variants = [
        (torch.from_numpy(pred).long()[None], torch.from_numpy(gt)[None]),  # (1, H, W) int64 vs uint8
        (pred.astype(np.int32), gt[None].astype(np.uint16)),  # (H, W) vs (1, H, W)
        (torch.from_numpy(pred).to(torch.int8), gt.astype(np.int64)),  # int8: 255 wraps to -1, still a miss
        (pred.T.copy().T, gt[:, ::-1][:, ::-1]),  # non-contiguous arrays
    ]
    for p, g in variants:
        cm = ConfusionMatrix(5)
        cm.update(p, g)
        torch.testing.assert_close(cm.counts, reference.counts)
    with pytest.raises(TypeError, match="integer"):
        ConfusionMatrix(5).update(pred.astype(np.float32), gt)
    with pytest.raises(ValueError, match="shape"):
        ConfusionMatrix(5).update(pred[:, :3], gt)
    half = ConfusionMatrix(5)
    half.update(pred[:2], gt[:2])
    rest = ConfusionMatrix(5)
    rest.update(pred[2:], gt[2:])
    torch.testing.assert_close(half.merge(rest).counts, reference.counts)
    torch.testing.assert_close(
        ConfusionMatrix(5).merge(reference.counts.to_sparse()).counts, reference.counts
    )
    assert ConfusionMatrix(5).all_reduce().counts.sum() == 0  # no process group: a no-op


@pytest.mark.parametrize("reduce_zero_label", [False, True])
@pytest.mark.parametrize("ignore_index", [255, 0, -1])
def test_torch_and_numpy_counting_agree(reduce_zero_label: bool, ignore_index: int) -> None:
    """The torch kernel (used off the CPU) against the numpy kernel (used on the CPU), over integer dtypes."""
    rng = np.random.default_rng(9)
    for dtype in (np.uint8, np.int8, np.int16, np.int32, np.int64):
        lo = -3 if np.iinfo(dtype).min < 0 else 0
        gt = rng.integers(lo, 30, size=500).astype(dtype)
        pred = rng.integers(lo, 30, size=500).astype(dtype)
        gt[:20] = np.array(255).astype(dtype)
        args = (7, ignore_index, reduce_zero_label)
        expected = _count_numpy(pred, gt, *args)
        got = _count_torch(torch.from_numpy(pred), torch.from_numpy(gt), *args)
        np.testing.assert_array_equal(got.numpy(), expected, err_msg=str(dtype))
        assert expected.sum() == 500


@needs_fake_cuda
def test_a_cuda_prediction_against_a_numpy_ground_truth_counts_on_the_device_as_on_the_cpu() -> None:
    """A matrix made without a device takes the first prediction's (the counts move there before they are added)."""
    pairs = random_pairs(5, 21)
    with fake_cuda():
        gpu = ConfusionMatrix(21)
        for pred, gt in pairs:
            gpu.update(torch.from_numpy(pred).to("cuda"), gt)
        assert gpu.counts.device.type == "cuda"
        counts = gpu.counts.cpu()
    cpu = ConfusionMatrix(21)
    for pred, gt in pairs:
        cpu.update(pred, gt)
    assert torch.equal(counts, cpu.counts)


def _ddp_worker(rank: int, init_file: str, out_file: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    cm = ConfusionMatrix(21)
    for pred, gt in random_pairs(6, 21)[rank::2]:
        cm.update(pred, gt)
    cm.all_reduce()
    if rank == 0:
        torch.save(cm.counts, out_file)
    dist.destroy_process_group()


@pytest.mark.slow
def test_all_reduce_sums_over_two_ranks(tmp_path: Path) -> None:
    torch.multiprocessing.spawn(
        _ddp_worker, args=(str(tmp_path / "init"), str(tmp_path / "out.pt")), nprocs=2
    )
    single = ConfusionMatrix(21)
    for pred, gt in random_pairs(6, 21):
        single.update(pred, gt)
    torch.testing.assert_close(torch.load(tmp_path / "out.pt"), single.counts)


def test_format_table() -> None:
    pred, gt = hand_example()
    cm = ConfusionMatrix(5)
    cm.update(pred, gt)
    text = format_table(cm.compute(class_names=["bg", "a", "b", "c", "d"]), title="val")
    lines = text.splitlines()
    assert lines[0] == "val"
    assert "| bg    | 25.00 |  33.33 |" in lines
    assert "| d     |   nan |    nan |" in lines
    assert "| 63.64 | 38.75 | 61.11 |" in lines


# --------------------------------------------------------------------------------------- folders and CLI
