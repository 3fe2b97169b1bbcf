"""The confusion-matrix evaluator: equality with mmseg's IoUMetric, hand-computed values, the CLI, DDP."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from tools import eval as eval_cli
from wsss.data.classes import voc_palette
from wsss.evaluation.metrics import (
    ConfusionMatrix,
    _count_numpy,
    _count_torch,
    evaluate_folders,
    format_table,
    index_masks,
)
from wsss.utils.fileio import save_mask

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


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu() -> None:
    pairs = random_pairs(5, 21)
    gpu = ConfusionMatrix(21)
    for pred, gt in pairs:
        gpu.update(torch.from_numpy(pred).cuda(), gt)
    assert gpu.counts.device.type == "cuda"
    cpu = ConfusionMatrix(21)
    for pred, gt in pairs:
        cpu.update(pred, gt)
    torch.testing.assert_close(gpu.counts.cpu(), cpu.counts)


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


def write_folders(root: Path, num: int = 5, seed: int = 7):
    """gt/[sub/]<id>.png (palette) and pred/[sub/]<id>.png (gray), some nested, plus one unscored pred."""
    rng = np.random.default_rng(seed)
    pairs = {}
    for i in range(num):
        key = f"set{i % 2}/img_{i}" if i % 3 else f"img_{i}"
        h, w = 12 + i, 17 + 2 * i
        gt = rng.integers(0, 3, size=(h, w)).astype(np.uint8)
        gt[0] = 255
        pred = np.where(rng.random((h, w)) < 0.7, gt, rng.integers(0, 3, size=(h, w))).astype(np.uint8)
        pred[0] = 1
        save_mask(root / "gt" / f"{key}.png", gt, voc_palette())
        save_mask(root / "pred" / f"{key}.png", pred)
        pairs[key] = (pred, gt)
    save_mask(root / "pred" / "unscored.png", np.zeros((5, 5), np.uint8))
    return pairs


def test_evaluate_folders_matches_in_memory(tmp_path: Path) -> None:
    pairs = write_folders(tmp_path)
    assert set(index_masks(tmp_path / "gt")) == set(pairs)
    cm = ConfusionMatrix(3)
    for pred, gt in pairs.values():
        cm.update(pred, gt)
    for workers in (0, 2):
        result = evaluate_folders(tmp_path / "pred", tmp_path / "gt", 3, num_workers=workers)
        assert result.summary == cm.compute().summary
    subset = ["img_0.png", "set1/img_1"]
    cm_sub = ConfusionMatrix(3)
    for key in ("img_0", "set1/img_1"):
        cm_sub.update(*pairs[key])
    assert (
        evaluate_folders(tmp_path / "pred", tmp_path / "gt", 3, ids=subset).summary
        == cm_sub.compute().summary
    )


def test_cli_writes_table_and_json(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pairs = write_folders(tmp_path)
    (tmp_path / "classes.txt").write_text("background\ncat\ndog\n")
    out = tmp_path / "out" / "metrics.json"
    argv = [str(tmp_path / "pred"), str(tmp_path / "gt"), "--classes", str(tmp_path / "classes.txt")]
    assert eval_cli.main([*argv, "--json", str(out), "--workers", "2"]) == 0
    cm = ConfusionMatrix(3)
    for pred, gt in pairs.values():
        cm.update(pred, gt)
    expected = cm.compute(class_names=["background", "cat", "dog"])
    data = json.loads(out.read_text())
    assert {k: data[k] for k in ("aAcc", "mIoU", "mAcc")} == expected.summary
    assert data["per_class"]["IoU"] == dict(
        zip(["background", "cat", "dog"], expected.per_class["IoU"].tolist(), strict=True)
    )
    assert set(data["per_class"]) == {"IoU", "Acc"}
    printed = capsys.readouterr().out
    assert format_table(expected) in printed and f"mIoU {expected['mIoU']:.2f}" in printed


def test_cli_errors_name_the_files(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    write_folders(tmp_path)
    pred, gt = str(tmp_path / "pred"), str(tmp_path / "gt")
    (tmp_path / "pred" / "set1" / "img_1.png").unlink()
    assert eval_cli.main([pred, gt, "--num-classes", "3"]) == 2
    err = capsys.readouterr().err
    assert "1 of 5 ground-truth masks have no prediction" in err and "set1/img_1" in err

    save_mask(tmp_path / "pred" / "set1" / "img_1.png", np.zeros((4, 4), np.uint8))
    assert eval_cli.main([pred, gt, "--num-classes", "3"]) == 2
    err = capsys.readouterr().err
    assert "size mismatch" in err and str(tmp_path / "pred" / "set1" / "img_1.png") in err and "4x4" in err

    save_mask(tmp_path / "pred" / "set1" / "img_1.png", np.zeros((13, 19), np.uint8))
    assert eval_cli.main([pred, gt, "--num-classes", "3"]) == 0
    assert eval_cli.main([pred, gt, "--num-classes", "2"]) == 2  # labels 2 are out of range for 2 classes
    assert "outside [0, 2)" in capsys.readouterr().err


def test_cli_reduce_zero_label(tmp_path: Path) -> None:
    gt = np.array(
        [[0, 1, 2, 3], [3, 3, 255, 1]], dtype=np.uint8
    )  # reduced: ignore, 0, 1, 2 / 2, 2, ignore, 0
    pred = np.array([[2, 0, 1, 1], [2, 0, 0, 0]], dtype=np.uint8)
    save_mask(tmp_path / "gt" / "a.png", gt)
    save_mask(tmp_path / "pred" / "a.png", pred)
    out = tmp_path / "m.json"
    argv = [str(tmp_path / "pred"), str(tmp_path / "gt"), "--num-classes", "3", "--reduce-zero-label"]
    assert eval_cli.main([*argv, "--json", str(out)]) == 0
    # scored (gt, pred): (0,0) (1,1) (2,1) (2,2) (2,0) (0,0): IoU [2/3, 1/2, 1/3]
    assert json.loads(out.read_text())["per_class"]["IoU"] == {"0": 66.67, "1": 50.0, "2": 33.33}


# ---------------------------------------------------------------------------------------- mmseg registry


def test_mmseg_registry_metric_matches_iou_metric(tmp_path: Path) -> None:
    from mmengine.utils import import_modules_from_strings
    from mmseg.registry import METRICS

    from wsss.evaluation.metrics import register_mmseg_metric

    cls = register_mmseg_metric()
    import_modules_from_strings(["wsss.evaluation.mmseg_metric"])  # what `custom_imports` in a config does
    assert METRICS.get("WSSSIoUMetric") is cls
    pairs = random_pairs(8, 21)
    for metrics in (["mIoU"], ALL_METRICS):
        reference, _ = run_mmseg(pairs, 21, metrics)
        ours, _ = run_mmseg(pairs, 21, metrics, metric_type="WSSSIoUMetric")
        assert ours.keys() == reference.keys()
        for key in reference:
            assert ours[key] == pytest.approx(reference[key], abs=1e-4), key

    metric = METRICS.build(dict(type="WSSSIoUMetric", output_dir=str(tmp_path / "out"), prefix="val"))
    metric.dataset_meta = dict(classes=["a", "b", "c"])
    pred, gt = hand_example()
    pred = np.minimum(pred, 2)
    sample = dict(
        pred_sem_seg=dict(data=torch.from_numpy(pred)[None].long()),
        gt_sem_seg=dict(data=torch.from_numpy(gt)[None]),
        img_path="/x/y/2007_000033.jpg",
    )
    metric.process({}, [sample, sample])
    # evaluate(size=1) keeps one of the two samples (mmengine drops the padding of distributed samplers):
    # tp = [1, 4, 3], gt area = [3, 4, 4], pred area = [2, 5, 4] -> IoU [1/4, 4/5, 3/5], Acc [1/3, 1, 3/4]
    assert metric.evaluate(1) == {"val/aAcc": 72.73, "val/mIoU": 55.0, "val/mAcc": 69.44}
    with Image.open(tmp_path / "out" / "2007_000033.png") as im:
        np.testing.assert_array_equal(np.asarray(im), pred)


def test_evaluation_imports_without_mmseg() -> None:
    code = "import sys, wsss.evaluation.metrics; assert 'mmseg' not in sys.modules and 'mmengine' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
