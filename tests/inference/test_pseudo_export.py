"""tools/make_pseudo_labels.py: the training step's pseudo labels on whole images, sharded, resumable, scored."""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import Future
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from mmengine.config import Config as MMConfig
from PIL import Image

from tests.conftest import (
    MODEL_PRECISIONS,
    assert_same_files,
    expected_precision,
    model_precision_seen,
    record_at_calls,
    resized_copy,
)
from tests.fake_cuda import fake_cuda, needs_fake_cuda
from tools import eval as eval_cli
from tools import make_pseudo_labels as export_cli
from wsss.data.labels import load_labels
from wsss.data.transforms import normalize
from wsss.data.voc import read_split
from wsss.engine.step import pseudo_label_targets
from wsss.inference import crf as crf_module
from wsss.inference.crf import crf_labels
from wsss.inference.exports import pseudo_labels as export_module
from wsss.inference.exports.pseudo_labels import DENSE_DIR, PSEUDO_DIR, pseudo_masks
from wsss.model_file import config_from_checkpoint, model_from_checkpoint
from wsss.par import PAR
from wsss.pseudo_label import combine_dual_threshold, refine_cam_stacks, refine_cams_with_par
from wsss.utils.fileio import read_image, read_mask

pytestmark = pytest.mark.usefixtures("one_thread")

REPO = Path(__file__).resolve().parents[2]
SPLIT = "trainval"
ARGS = ["--split", SPLIT, "--device", "cpu", "--no-progress"]


def outputs(out: Path) -> dict[str, bytes]:
    """Every file under OUT by relative path; OUT itself is written as ``OUT`` in the files that name it."""
    return {
        p.relative_to(out).as_posix(): p.read_bytes().replace(os.path.realpath(out).encode(), b"OUT")
        for p in sorted(out.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def exported(toy_checkpoint, tmp_path_factory):
    """The toy set, its checkpoint, and the 1-process export of split trainval (6 images)."""
    root, ckpt = toy_checkpoint
    out = tmp_path_factory.mktemp("pseudo") / "out"
    assert export_cli.main([str(ckpt), str(out), *ARGS]) == 0
    return root, ckpt, out


def full_image_targets(root: Path, ckpt: Path, image_id: str):
    """The training step's pseudo labels of one whole image (box = the image, no crop, no augmentation)."""
    model, raw_ckpt = model_from_checkpoint(ckpt)
    cfg = config_from_checkpoint(raw_ckpt)
    mean, std = tuple(raw_ckpt["mean"]), tuple(raw_ckpt["std"])
    labels = load_labels(root / "cls_labels.json", raw_ckpt["classes"])[image_id]
    raw = read_image(root / "JPEGImages" / f"{image_id}.jpg")
    image = normalize(raw, mean, std)[None]
    label = torch.from_numpy(labels.astype(np.float32))[None]
    box = torch.tensor([[0, raw.shape[0], 0, raw.shape[1]]])
    par = PAR.from_config(cfg.par)
    targets = pseudo_label_targets(model, image, label, box, par, cfg, mean, std, cam_autocast=False, max_present=None)
    return targets, label, par, cfg, raw


def test_masks_equal_the_training_steps_pseudo_labels(exported):
    """Every dual-threshold mask is the step's pseudo_label_targets on the whole image; every dense mask is the same
    CAMs and PAR with the one background plane cam.infer_bg_thresh (tools/eval_cams.py's "every pixel")."""
    root, ckpt, out = exported
    ids = read_split(root / "ImageSets" / "Segmentation" / f"{SPLIT}.txt")
    assert (out / "ImageSets" / "Segmentation" / f"{SPLIT}.txt").read_text().split() == ids
    seen = set()
    for image_id in ids:
        targets, label, par, cfg, _ = full_image_targets(root, ckpt, image_id)
        got = Image.open(out / PSEUDO_DIR / f"{image_id}.png")
        assert got.mode == "P" and got.getpalette()[3:6] == [128, 0, 0]  # the VOC palette
        np.testing.assert_array_equal(read_mask(out / PSEUDO_DIR / f"{image_id}.png"), targets.label[0].numpy())
        single = refine_cams_with_par(targets.rgb, targets.cams, label, (cfg.cam.infer_bg_thresh,), par, cfg.par.scale)
        np.testing.assert_array_equal(read_mask(out / DENSE_DIR / f"{image_id}.png"), single[0, 0].numpy())
        seen |= set(np.unique(targets.label).tolist())
    assert {0, 255} < seen and len(seen) > 3  # background, uncertain and several classes: a mix-up shows


def test_one_pixel_high_images_get_masks(toy_checkpoint):
    """A 1x1 or 1x40 image at cam.scales 0.5 (and par.scale 0.5) once ended in ``RuntimeError: Input and output
    sizes should be greater than 0``; each now gets its two masks, as large as the image."""
    _, ckpt = toy_checkpoint
    model, raw_ckpt = model_from_checkpoint(ckpt)
    cfg = config_from_checkpoint(raw_ckpt)
    assert 0.5 in cfg.cam.scales and cfg.par.scale == 0.5
    mean, std = tuple(raw_ckpt["mean"]), tuple(raw_ckpt["std"])
    for size in ((1, 1), (1, 40), (40, 1)):
        image = normalize(np.full((*size, 3), 90, np.uint8), mean, std)[None]
        labels = torch.ones(1, len(raw_ckpt["classes"]) - 1)
        certain, dense = pseudo_masks(model.eval(), image, labels, cfg, mean, std, PAR.from_config(cfg.par))
        assert certain.shape == dense.shape == size and dense.max() < len(raw_ckpt["classes"])


@needs_fake_cuda
@pytest.mark.parametrize(("mode", "dtype", "device"), MODEL_PRECISIONS)
def test_the_cam_pass_runs_with_the_configured_precision(toy_checkpoint, monkeypatch, mode, dtype, device):
    """``infer.fp32_precision`` (the flags a GPU's cuBLAS and cuDNN read) and ``infer.dtype`` (bf16 autocast on a GPU,
    ignored on a CPU) hold while the export's CAMs are computed, not after."""
    _, ckpt = toy_checkpoint
    model, raw_ckpt = model_from_checkpoint(ckpt)
    cfg = config_from_checkpoint(raw_ckpt)
    cfg = dataclasses.replace(cfg, infer=dataclasses.replace(cfg.infer, fp32_precision=mode, dtype=dtype),
                              par=dataclasses.replace(cfg.par, kernel="torch"))  # fmt: skip
    mean, std = tuple(raw_ckpt["mean"]), tuple(raw_ckpt["std"])
    seen = record_at_calls(monkeypatch, export_module, "multiscale_cam", model_precision_seen)
    before = model_precision_seen()
    with fake_cuda():  # CUDA autocast "available" on either device
        image = normalize(np.full((24, 32, 3), 90, np.uint8), mean, std, device)[None]
        labels = torch.ones(1, len(raw_ckpt["classes"]) - 1, device=device)
        pseudo_masks(model.eval().to(device), image, labels, cfg, mean, std, PAR.from_config(cfg.par).to(device))
    assert seen == [expected_precision(mode, dtype, device)] and model_precision_seen() == before


def test_crf_refines_each_stack_before_the_thresholds_combine(toy_checkpoint, tmp_path):
    """--crf: each of the three refined stacks (normalised) through the dense CRF, then the dual-threshold rule, so
    pixels stay 255 where the CRF'd stacks disagree."""
    root, ckpt = toy_checkpoint
    out = tmp_path / "out"
    args = [str(ckpt), str(out), "--split", "val", "--crf", "--crf-workers", "0", "--device", "cpu", "--no-progress"]
    assert export_cli.main(args) == 0
    for image_id in read_split(root / "ImageSets" / "Segmentation" / "val.txt"):
        targets, label, par, cfg, raw = full_image_targets(root, ckpt, image_id)
        planes = (cfg.cam.fg_thresh, cfg.cam.bg_thresh, cfg.cam.infer_bg_thresh)
        scores, keys = refine_cam_stacks(targets.rgb, targets.cams, label, planes, par, cfg.par.scale)
        crf = [crf_labels(raw, (s / s.sum(0)).numpy(), cfg.infer.crf).astype(np.int64) for s in scores[:, 0]]
        high, low, single = (keys[0][torch.from_numpy(index)] for index in crf)
        certain = combine_dual_threshold(high[None], low[None], None, 255)[0]
        assert 255 in certain and not torch.equal(certain, targets.label[0])  # the CRF changed the masks
        np.testing.assert_array_equal(read_mask(out / PSEUDO_DIR / f"{image_id}.png"), certain.numpy())
        np.testing.assert_array_equal(read_mask(out / DENSE_DIR / f"{image_id}.png"), single.numpy())
    assert json.loads((out / "run.json").read_text())["crf"] is True


def test_crf_workers_write_the_masks_of_the_inline_crf(toy_checkpoint, tmp_path, monkeypatch):
    """On the CPU the torch CRF runs in --crf-workers processes while the next images' CAMs run: the same files as
    with the CRF in the exporting process (--crf-workers 0)."""
    _, ckpt = toy_checkpoint
    trees, calls = {}, []
    monkeypatch.setattr(export_module, "threads_beside", lambda workers, chosen: calls.append((workers, chosen)))
    for workers in ("0", "2"):
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # the user chose none (a run sets it for its processes)
        out = tmp_path / workers
        assert export_cli.main([str(ckpt), str(out), *ARGS, "--crf", "--crf-workers", workers]) == 0
        trees[workers] = {k: v for k, v in outputs(out).items() if k.endswith(".png")}
    assert len(trees["0"]) == 12 and trees["2"] == trees["0"]
    assert calls == [(2, None)]  # the model's threads: the CPUs the 2 workers leave (none to count for 0; on the CPU
    # the images are decoded in the exporting process)


class LazyCrf:
    """A stand-in pool of ``workers`` processes whose jobs finish only when their result is asked for, recording at
    each submission how many images' jobs were still unfinished: what the export keeps waiting."""

    def __init__(self, cfg, workers=None, device=None):
        self.cfg, self.workers, self.jobs, self.unfinished = cfg, 1, [], []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def submit_stacked(self, images, probs):
        self.unfinished.append(sum(not job.done() for job in self.jobs))
        jobs = [LazyJob(partial(self.labels, i, p)) for i, p in zip(images, probs, strict=True)]
        self.jobs += jobs
        return [[LazyPart(job, s) for s in range(len(p))] for job, p in zip(jobs, probs, strict=True)]

    def labels(self, image, probs):
        return crf_module.crf_labels_stacked(image, probs, self.cfg).numpy()


class LazyJob(Future):
    def __init__(self, run):
        super().__init__()
        self.run = run

    def result(self, timeout=None):
        if not self.done():
            self.set_result(self.run())
        return super().result()


class LazyPart(Future):
    def __init__(self, job, index):
        super().__init__()
        self.job, self.index = job, index

    def done(self):
        return self.job.done()

    def result(self, timeout=None):
        return self.job.result()[self.index]


def test_the_export_waits_for_at_most_two_images_per_crf_worker(toy_checkpoint, tmp_path, monkeypatch):
    """The queue of images waiting for the CRF is bounded (2 per worker), however slow the CRF: memory does not grow
    with the split. The masks are those of the inline CRF."""
    _, ckpt = toy_checkpoint
    pools = []
    monkeypatch.setattr(export_module, "CrfPool", lambda *a, **k: pools.append(LazyCrf(*a, **k)) or pools[-1])
    out = tmp_path / "lazy"
    assert export_cli.main([str(ckpt), str(out), *ARGS, "--crf"]) == 0
    monkeypatch.undo()
    assert pools[0].unfinished == [0, 1, 2, 2, 2, 2]  # 6 images, never more than 2 (1 worker) left waiting
    inline = tmp_path / "inline"
    assert export_cli.main([str(ckpt), str(inline), *ARGS, "--crf", "--crf-workers", "0"]) == 0
    pngs = [k for k in outputs(inline) if k.endswith(".png")]
    assert len(pngs) == 12 and all(outputs(out)[k] == outputs(inline)[k] for k in pngs)


@pytest.mark.parametrize("crf", ["argmax", "crf", "crf-together"])
def test_batches_of_one_size_write_the_masks_of_one_image_at_a_time(toy_checkpoint, tmp_path, monkeypatch, crf):
    """--batch-size 4 over the 4 train images at one size (1, 1, 2 and 1 classes: the batch's stacks are padded) and
    the 2 val images at another: a batch of 4 and one of 2, the masks byte for byte those of batches of 1. With
    ``crf-together`` the batch's CRF runs as on a GPU (the pool in the exporting process, the images of a batch in
    shared mean-field runs: two per run on the CPU, CPU_RUN_PIXELS)."""
    root, ckpt = toy_checkpoint
    sizes = {**{f"train_{i:05d}": (200, 160) for i in range(4)}, **{f"val_{i:05d}": (160, 200) for i in range(2)}}
    data = resized_copy(root, tmp_path / "data", sizes)
    batches, runs, real_cam, real_field = [], [], export_module.multiscale_cam, crf_module._mean_field
    real_pool = export_module.CrfPool

    def recording_cam(cam_fn, images, labels, scales, **options):
        batches.append(labels.sum(dim=1).tolist())  # the classes of each image of the batch
        return real_cam(cam_fn, images, labels, scales, **options)

    def recording_field(images, probs, *args):
        runs.append([p.shape[0] for p in probs])  # the channels of each image of the run
        return real_field(images, probs, *args)

    def pool_in_process(cfg, workers, device):  # as on a GPU
        return real_pool(cfg, workers, device=None)

    monkeypatch.setattr(export_module, "multiscale_cam", recording_cam)
    monkeypatch.setattr(crf_module, "_mean_field", recording_field)
    trees = {}
    for batch_size in ("1", "4"):
        batches.clear()
        runs.clear()
        if crf == "crf-together" and batch_size == "4":
            monkeypatch.setattr(export_module, "CrfPool", pool_in_process)
        out = tmp_path / batch_size
        args = [str(ckpt), str(out), *ARGS, "--batch-size", batch_size, "--cfg-options", f"data.root={data}"]
        assert export_cli.main(args + (["--crf", "--crf-workers", "0"] if crf != "argmax" else [])) == 0
        trees[batch_size] = {k: v for k, v in outputs(out).items() if k.endswith(".png")}
    assert batches == [[1, 1, 2, 1], [1, 1]]
    assert runs == {"argmax": [], "crf": [[6], [6], [9], [6], [6], [6]], "crf-together": [[6, 6], [9, 6], [6, 6]]}[crf]
    assert len(trees["1"]) == 12 and trees["4"] == trees["1"]


def test_unreadable_and_oversized_images_are_skipped_and_named(toy_checkpoint, tmp_path, capsys):
    """A corrupt image and one over data.max_image_pixels get no masks and are named with the reason; the others are
    exported, and a re-run tries the skipped ones again."""
    root, ckpt = toy_checkpoint
    data = resized_copy(root, tmp_path / "data", {"train_00001": (400, 400)})
    (data / "JPEGImages" / "val_00000.jpg").write_bytes(b"not a jpeg")
    out = tmp_path / "out"
    options = ["--cfg-options", f"data.root={data}", "data.max_image_pixels=100000"]
    assert export_cli.main([str(ckpt), str(out), *ARGS, *options]) == 0
    printed = capsys.readouterr().out
    assert "4 of 6 images exported" in printed and "2 skipped" in printed
    assert "skipped train_00001: 400x400 is 160,000 pixels, over data.max_image_pixels = 100,000" in printed
    assert "skipped val_00000: not a readable image" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert [s["path"] for s in summary["skipped"]] == ["train_00001", "val_00000"]
    assert sorted(p.name for p in (out / PSEUDO_DIR).glob("*.png")) == [
        "train_00000.png", "train_00002.png", "train_00003.png", "val_00001.png"]
    assert (out / "ImageSets" / "Segmentation" / f"{SPLIT}.txt").read_text().split() == [
        "train_00000", "train_00002", "train_00003", "val_00001"]
    assert export_cli.main([str(ckpt), str(out), *ARGS, "--cfg-options", f"data.root={data}"]) == 0
    assert "5 of 6 images exported (1 now" in capsys.readouterr().out  # the large image, allowed now


def test_resume_skips_finished_images_and_refuses_other_settings(exported, tmp_path, capsys):
    root, ckpt, done = exported
    expected = outputs(done)
    out = tmp_path / "out"
    shutil.copytree(done, out)
    (out / PSEUDO_DIR / "train_00001.png").unlink()  # an image half written: one of its two masks is gone
    (out / DENSE_DIR / "val_00000.png").unlink()
    (out / PSEUDO_DIR / "train_00002.png").write_bytes(b"kept")  # a finished image is not redone
    assert export_cli.main([str(ckpt), str(out), *ARGS]) == 0
    assert "6 of 6 images exported (2 now" in capsys.readouterr().out
    assert (out / PSEUDO_DIR / "train_00002.png").read_bytes() == b"kept"
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["done"], summary["existing"], summary["exported"]) == (2, 4, 6)
    (out / PSEUDO_DIR / "train_00002.png").unlink()
    assert export_cli.main([str(ckpt), str(out), *ARGS]) == 0
    got = outputs(out)
    assert got.pop("summary.json") != expected.pop("summary.json")  # its counts: done 1, existing 5
    assert_same_files(got, expected)  # the masks, split file, labels and configs (OUT written as OUT)

    other = [str(ckpt), str(out), *ARGS, "--cfg-options", "cam.fg_thresh=0.6"]
    assert export_cli.main(other) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "other settings (cam differ" in err and "--overwrite" in err
    assert export_cli.main([*other, "--overwrite"]) == 0
    assert json.loads((out / "run.json").read_text())["cam"]["fg_thresh"] == 0.6
    assert outputs(out)[f"{PSEUDO_DIR}/train_00000.png"] != expected[f"{PSEUDO_DIR}/train_00000.png"]


def test_second_stage_configs_point_at_the_export(exported):
    """mmseg_train.py loads with mmengine (mmseg's DeepLabV3+ base); its train set and the snippet name the images,
    the dual-threshold masks and the exported ids as mmseg's BaseSegDataset joins them."""
    root, ckpt, out = exported
    cfg = MMConfig.fromfile(out / "mmseg_train.py")
    snippet = MMConfig.fromfile(out / "mmseg_dataset.py")
    classes = (root / "classes.txt").read_text().split()
    for dataset in (cfg.train_dataloader.dataset, snippet.pseudo_label_dataset):
        assert dataset.type == "BaseSegDataset" and "datasets" not in dataset
        assert (dataset.reduce_zero_label, dataset.ignore_index, dataset.seg_map_suffix) == (False, 255, ".png")
        assert list(dataset.metainfo.classes) == classes and len(dataset.metainfo.palette) == len(classes)
        names = Path(dataset.ann_file).read_text().split()
        assert names == read_split(root / "ImageSets" / "Segmentation" / f"{SPLIT}.txt")
        image_dir = Path(dataset.data_root) / dataset.data_prefix.img_path
        for name in names:
            assert (image_dir / f"{name}{dataset.img_suffix}").is_file()
            assert (Path(dataset.data_prefix.seg_map_path) / f"{name}.png").samefile(out / PSEUDO_DIR / f"{name}.png")
    assert cfg.train_dataloader.dataset.pipeline[0].type == "LoadImageFromFile"  # mmseg's train pipeline kept
    assert cfg.model.decode_head.num_classes == len(classes) == cfg.model.auxiliary_head.num_classes
    val = cfg.val_dataloader.dataset
    assert Path(val.ann_file).samefile(root / "ImageSets" / "Segmentation" / "val.txt")
    assert (Path(val.data_root) / val.data_prefix.seg_map_path / "val_00000.png").is_file()
    assert "no loss.* key makes it read masks" in " ".join(
        (out / "mmseg_train.py").read_text().replace("#", "").split()
    )


def test_eval_scores_the_export_as_computed_by_hand(exported, tmp_path, capsys):
    """tools/eval.py on the export: every pixel (dense masks) and certain pixels only (255 excluded, its share
    reported) equal a confusion matrix counted here in numpy."""
    root, ckpt, done = exported
    out = tmp_path / "out"
    shutil.copytree(done, out)
    assert export_cli.main([str(ckpt), str(out), *ARGS]) == 0  # all kept: prints the scoring commands
    printed = capsys.readouterr().out
    gt_dir, ids = root / "SegmentationClass", out / "ImageSets" / "Segmentation" / f"{SPLIT}.txt"
    assert f"python tools/eval.py {out / DENSE_DIR} {gt_dir} --ids {ids}" in printed
    assert f"python tools/eval.py {out / PSEUDO_DIR} {gt_dir} --ids {ids} --certain-only" in printed
    num = len((root / "classes.txt").read_text().split())
    dense_cm, certain_cm, uncertain, scored = np.zeros((num, num)), np.zeros((num, num)), 0, 0
    for name in ids.read_text().split():
        gt = read_mask(gt_dir / f"{name}.png").astype(np.int64)
        dense = read_mask(out / DENSE_DIR / f"{name}.png").astype(np.int64)
        pseudo = read_mask(out / PSEUDO_DIR / f"{name}.png").astype(np.int64)
        valid = gt < num
        np.add.at(dense_cm, (gt[valid], dense[valid]), 1)
        sure = valid & (pseudo != 255)
        np.add.at(certain_cm, (gt[sure], pseudo[sure]), 1)
        uncertain += int((valid & (pseudo == 255)).sum())
        scored += int(valid.sum())

    def miou(cm):
        with np.errstate(invalid="ignore"):  # a class absent from both: NaN, left out of the mean
            iou = np.diag(cm) / (cm.sum(0) + cm.sum(1) - np.diag(cm))
        return round(100 * float(np.nanmean(iou)), 2)

    every, certain = tmp_path / "every.json", tmp_path / "certain.json"
    common = ["--ids", str(ids), "--workers", "0", "--device", "cpu"]
    assert eval_cli.main([str(out / DENSE_DIR), str(gt_dir), *common, "--json", str(every)]) == 0
    assert eval_cli.main([str(out / PSEUDO_DIR), str(gt_dir), *common, "--certain-only", "--json", str(certain)]) == 0
    assert f"classes from {out / 'image_labels.json'}" in capsys.readouterr().out
    every, certain = json.loads(every.read_text()), json.loads(certain.read_text())
    assert every["mIoU"] == miou(dense_cm) and certain["mIoU"] == miou(certain_cm)
    assert (certain["uncertain_pixels"], certain["scored_pixels"]) == (uncertain, scored) and 0 < uncertain < scored
    assert certain["uncertain_fraction"] == pytest.approx(uncertain / scored)


def test_errors_are_one_line_and_write_nothing(toy_checkpoint, tmp_path, capsys):
    root, ckpt = toy_checkpoint
    out = str(tmp_path / "out")
    cases = [
        ([str(tmp_path / "missing.pth"), out], f"checkpoint {tmp_path / 'missing.pth'} not found"),
        ([str(ckpt), str(root), "--split", "train"], "is the dataset's split file, which the export would overwrite"),
        ([str(ckpt), out, "--cfg-options", "cam.fg_thres=0.5"], "unknown config key 'cam.fg_thres'"),
        ([str(ckpt), out, "--split", "nosuch"], "split file not found"),
        ([str(ckpt), out, "--launcher", "pytorch"], "--launcher pytorch needs the environment torchrun sets"),
    ]
    for argv, message in cases:
        assert export_cli.main([*argv, "--device", "cpu", "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err and err.count("\n") == 1, err
    assert not (root / PSEUDO_DIR).exists() and not (tmp_path / "out").exists()


def torchrun(ranks: int, *args: str) -> subprocess.CompletedProcess:
    """``ranks`` CPU processes under torchrun on a free port (``--standalone``), gloo."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks), *args]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_two_ranks_equal_one_rank_byte_for_byte(exported, tmp_path):
    root, ckpt, done = exported
    out = tmp_path / "out"
    proc = torchrun(2, "tools/make_pseudo_labels.py", str(ckpt), str(out), *ARGS, "--launcher", "pytorch")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_same_files(outputs(out), outputs(done))
    assert proc.stdout.count("6 of 6 images exported (6 now") == 1  # rank 0 prints the merged summary


@pytest.mark.slow
def test_resume_on_two_ranks_after_one(exported, tmp_path):
    """A 1-process export with images missing, finished on 2 ranks: the same bytes."""
    root, ckpt, done = exported
    out = tmp_path / "out"
    shutil.copytree(done, out)
    for name in ("train_00000", "train_00003", "val_00001"):
        (out / PSEUDO_DIR / f"{name}.png").unlink()
    (out / DENSE_DIR / "train_00002.png").unlink()
    (out / "summary.json").unlink()
    proc = torchrun(2, "tools/make_pseudo_labels.py", str(ckpt), str(out), *ARGS, "--launcher", "pytorch")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["done"], summary["existing"]) == (4, 2)
    got, expected = outputs(out), outputs(done)
    assert got.pop("summary.json") != expected.pop("summary.json")
    assert_same_files(got, expected)


def test_a_killed_export_resumed_with_other_settings_is_refused(exported, tmp_path, monkeypatch, capsys):
    """Issue 31, 1.2: masks of a killed export (one image half written; an --overwrite run with other settings
    stopped after one image) never mix with masks of other settings under one run.json."""
    from wsss.inference.exports import pseudo_labels as pseudo_export

    root, ckpt, done = exported
    other = ["--cfg-options", "cam.fg_thresh=0.6"]
    real_save, saved = pseudo_export.save_mask, []

    def killed_after(n):
        def save(path, *args):
            if len(saved) == n:
                raise KeyboardInterrupt  # as a SIGINT/SIGTERM lands mid-run
            saved.append(path)
            real_save(path, *args)

        return save

    half = tmp_path / "half"
    monkeypatch.setattr(pseudo_export, "save_mask", killed_after(1))  # one mask of the first image, no image done
    with pytest.raises(KeyboardInterrupt):
        export_cli.main([str(ckpt), str(half), *ARGS])
    monkeypatch.setattr(pseudo_export, "save_mask", real_save)
    assert export_cli.main([str(ckpt), str(half), *ARGS, *other]) == 2
    assert "other settings (cam differ" in capsys.readouterr().err

    out = tmp_path / "out"
    shutil.copytree(done, out)
    saved.clear()
    monkeypatch.setattr(pseudo_export, "save_mask", killed_after(2))  # one image redone, five kept
    with pytest.raises(KeyboardInterrupt):
        export_cli.main([str(ckpt), str(out), *ARGS, *other, "--overwrite"])
    monkeypatch.setattr(pseudo_export, "save_mask", real_save)
    assert json.loads((out / "run.json").read_text())["mixed_with"] == ["cam"]
    for settings in ([], other):  # neither kind may be added to
        assert export_cli.main([str(ckpt), str(out), *ARGS, *settings]) == 2
        err = capsys.readouterr().err
        assert "two kinds" in err and "--overwrite" in err, err
    assert export_cli.main([str(ckpt), str(out), *ARGS, *other, "--overwrite"]) == 0
    assert "mixed_with" not in json.loads((out / "run.json").read_text())  # every mask redone: one kind again
    assert export_cli.main([str(ckpt), str(out), *ARGS, *other]) == 0
    assert "0 now" in capsys.readouterr().out


def test_image_labels_name_the_classes_present_in_each_image(exported):
    """image_labels.json lists, for every exported image, the names of the classes its ground-truth mask holds
    (the toy label file is made from the masks), in class order, with the checkpoint's class list."""
    root, _, out = exported
    labels = json.loads((out / "image_labels.json").read_text())
    classes = (root / "classes.txt").read_text().split()
    assert labels["classes"] == classes
    ids = read_split(root / "ImageSets" / "Segmentation" / f"{SPLIT}.txt")
    assert sorted(labels["images"]) == sorted(ids)
    kinds = set()
    for image_id in ids:
        values = np.unique(read_mask(root / "SegmentationClass" / f"{image_id}.png"))
        want = [classes[k] for k in values if 0 < k < len(classes)]
        assert labels["images"][image_id] == {"present": want}, image_id
        kinds.add(tuple(want))
    assert len(kinds) > 1 and all(kinds)  # images differ in their classes, each has one: a shift of names shows


def test_the_checkpoint_is_known_by_its_content(exported, tmp_path, capsys):
    """Issue 38, section 2: the export knew its checkpoint by path; a checkpoint copied over the one of a killed
    export resumed it, and OUT held masks of two models. run.json now holds its SHA-256: the same bytes under
    another path resume, other bytes under the same path are refused."""
    root, ckpt, done = exported
    out = tmp_path / "out"
    shutil.copytree(done, out)
    run = json.loads((out / "run.json").read_text())
    assert run["checkpoint"].startswith("sha256:") and run["checkpoint_path"] == os.path.realpath(ckpt)
    for name in ("train_00000", "val_00001"):  # killed after 4 of 6 images
        (out / PSEUDO_DIR / f"{name}.png").unlink()
    model = tmp_path / "model.pth"
    shutil.copy(ckpt, model)  # the same checkpoint moved elsewhere
    assert export_cli.main([str(model), str(out), *ARGS]) == 0
    assert "6 of 6 images exported (2 now" in capsys.readouterr().out
    (out / PSEUDO_DIR / "train_00001.png").unlink()
    other = torch.load(ckpt, weights_only=True)
    name = next(k for k, v in other["model"].items() if v.is_floating_point())
    other["model"][name] = other["model"][name] + 0.5
    torch.save(other, model)  # another checkpoint copied over the path the export was made with
    assert export_cli.main([str(model), str(out), *ARGS]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "other settings (checkpoint differ" in err
    assert not (out / PSEUDO_DIR / "train_00001.png").exists()


def test_masks_without_a_readable_run_json_are_refused(exported, tmp_path, capsys):
    """Issue 38, section 2: with run.json truncated or deleted after a kill, a resume with other settings was accepted
    and run.json then claimed them for every mask. Masks without a readable record are of unknown settings: any
    resume is refused in one line naming --overwrite, which redoes every image and records its settings."""
    root, ckpt, done = exported
    other = ["--cfg-options", "cam.fg_thresh=0.6"]
    damages = {"truncated": '{"cam": ', "not a record": "[]\n", "deleted": None}
    for damage, text in damages.items():
        out = tmp_path / damage
        shutil.copytree(done, out)
        (out / PSEUDO_DIR / "train_00002.png").unlink()
        if text is None:
            (out / "run.json").unlink()
        else:
            (out / "run.json").write_text(text)
        for settings in (other, []):  # neither other settings nor the same ones: the masks' are unknown
            assert export_cli.main([str(ckpt), str(out), *ARGS, *settings]) == 2, damage
            err = capsys.readouterr().err
            assert err.startswith("error: ") and err.count("\n") == 1, err
            assert "holds the pseudo labels of 6 images without a readable" in err, err
            assert "--overwrite redoes every image" in err
        assert not (out / PSEUDO_DIR / "train_00002.png").exists()
    assert export_cli.main([str(ckpt), str(out), *ARGS, *other, "--overwrite"]) == 0
    run = json.loads((out / "run.json").read_text())
    assert run["cam"]["fg_thresh"] == 0.6 and "mixed_with" not in run  # every mask in OUT redone now
    assert "6 of 6 images exported (6 now" in capsys.readouterr().out


def test_two_exports_cannot_share_an_out(toy_checkpoint, tmp_path, capsys):
    """Issue 38, section 2: two exports started together into one OUT (one with other settings) both finished, and
    OUT held masks of both under one run.json. OUT is locked for the run: while another process holds
    OUT/export.lock (held here through another open file, as another process would), an export stops at once,
    naming the holder, and writes nothing; the lock file goes when a run ends."""
    _, ckpt = toy_checkpoint
    out = tmp_path / "out"
    out.mkdir()
    lock = out / "export.lock"
    with lock.open("w") as holder:
        holder.write("pid 4242 host node-b\n")
        holder.flush()
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert export_cli.main([str(ckpt), str(out), *ARGS, "--cfg-options", "cam.fg_thresh=0.6"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert f"{out} is in use by another pseudo-label export (pid 4242 host node-b, see {lock})" in err
    assert sorted(out.iterdir()) == [lock]  # no run.json, no mask
    assert export_cli.main([str(ckpt), str(out), *ARGS]) == 0  # a lock file left unlocked (a killed run) is taken
    assert not lock.exists() and (out / "run.json").is_file()


def test_another_splits_masks_keep_mixed_with(exported, tmp_path, capsys):
    """An --overwrite export of split val with other settings redoes val's images, but OUT still holds split
    train's masks of the earlier settings: run.json keeps naming the difference (mixed_with), so a resume without
    --overwrite is refused, until a run has redone every mask in OUT."""
    root, ckpt, done = exported
    out = tmp_path / "out"
    common = [str(ckpt), str(out), "--device", "cpu", "--no-progress"]
    assert export_cli.main([*common, "--split", "train"]) == 0
    other = ["--cfg-options", "cam.fg_thresh=0.6"]
    assert export_cli.main([*common, "--split", "val", *other, "--overwrite"]) == 0
    assert json.loads((out / "run.json").read_text())["mixed_with"] == ["cam"]
    capsys.readouterr()
    assert export_cli.main([*common, "--split", "val", *other]) == 2
    assert "two kinds" in capsys.readouterr().err
    assert export_cli.main([*common, "--split", "trainval", *other, "--overwrite"]) == 0  # every mask in OUT redone
    assert "mixed_with" not in json.loads((out / "run.json").read_text())


def test_the_clean_up_stays_in_outs_own_folders(exported, tmp_path):
    """A killed run's temporaries (this host, a dead process) go from OUT's top, its split folder and anywhere in its
    mask folders; a folder of the user's under OUT is never entered, whatever its files are named."""
    from tests.inference.test_layout import dead_pid
    from wsss.utils.fileio import temporary_prefix

    root, ckpt, done = exported
    out = tmp_path / "out"
    shutil.copytree(done, out)
    dead = dead_pid()

    def temporary(folder: Path, name: str) -> Path:
        path = folder / f"{temporary_prefix(name, dead)}q1w2e3r4.tmp"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("partial\n")
        return path

    stale = [temporary(out, "run.json"), temporary(out / "ImageSets" / "Segmentation", "trainval.txt"),
             temporary(out / PSEUDO_DIR / "sub", "a.png"), temporary(out / DENSE_DIR, "b.png")]  # fmt: skip
    users = [temporary(out / "notes", "draft.md"), temporary(out / "JPEGImages" / "x", "y.png")]
    assert export_cli.main([str(ckpt), str(out), *ARGS]) == 0
    assert [p.exists() for p in stale] == [False] * len(stale)
    assert [p.read_text() for p in users] == ["partial\n"] * len(users)
