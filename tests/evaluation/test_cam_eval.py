"""CAM threshold sweep and pseudo-label scoring against a numpy reference, and tools/eval_cams.py."""

from __future__ import annotations

import dataclasses
import io
import json

import numpy as np
import pytest
import torch

from tests.conftest import (
    MODEL_PRECISIONS,
    TINY_CLASSES,
    expected_precision,
    model_precision_seen,
    record_at_calls,
    resized_copy,
    tiny_config,
)
from tests.fake_cuda import fake_cuda, needs_fake_cuda
from tools import eval_cams as eval_cams_cli
from wsss.cam import cam_to_label, multiscale_cam
from wsss.data.transforms import backbone_mean_std, denormalize
from wsss.data.voc import VOCSegDataset, read_split
from wsss.engine.checkpoint import save_checkpoint
from wsss.evaluation import cam_eval
from wsss.evaluation.cam_eval import evaluate_cams, parse_thresholds, sweep_labels
from wsss.models import build_model
from wsss.par import PAR
from wsss.pseudo_label import refine_cams_with_par
from wsss.utils.fileio import read_mask

pytestmark = pytest.mark.usefixtures("one_thread")


def test_parse_thresholds():
    assert parse_thresholds("0.3:0.7:0.05") == [0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7]
    assert parse_thresholds("0.5") == [0.5]
    assert parse_thresholds("0.6,0.2,0.6") == [0.2, 0.6]
    for bad in ("0.7:0.3:0.1", "0.3:0.7:0", "a:b:c", "1.5", ""):
        with pytest.raises(ValueError):
            parse_thresholds(bad)


def test_sweep_equals_cam_to_label():
    torch.manual_seed(0)
    cam = torch.rand(2, 4, 9, 11)
    labels = torch.tensor([[1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    sweep = sweep_labels(cam, labels, [0.1, 0.5, 0.9])
    for t, got in zip([0.1, 0.5, 0.9], sweep, strict=True):
        assert torch.equal(got, cam_to_label(cam, labels, t))
    assert sweep[:, 1].eq(0).all()  # no present class: all background


def numpy_miou(pairs: list[tuple[np.ndarray, np.ndarray]], num_classes: int) -> float:
    """mIoU in percent over (pred, gt) pairs, gt 255 skipped, classes absent from both left out."""
    inter, union = np.zeros(num_classes), np.zeros(num_classes)
    for pred, gt in pairs:
        keep = gt < num_classes
        p, g = pred[keep], gt[keep]
        for c in range(num_classes):
            inter[c] += np.sum((p == c) & (g == c))
            union[c] += np.sum((p == c) | (g == c))
    with np.errstate(invalid="ignore"):
        return float(np.nanmean(inter / union) * 100)


@pytest.fixture
def random_checkpoint(tiny_voc, tmp_path):
    """A checkpoint of an untrained tiny model whose config names a data root that does not exist."""
    cfg = tiny_config(tiny_voc)
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, root=str(tmp_path / "moved")))
    cfg.work_dir = str(tmp_path / "elsewhere" / "tiny_run")  # where it was trained: its name names the work dir
    torch.manual_seed(3)
    model = build_model(cfg.model, num_classes=3)
    mean, std = backbone_mean_std(cfg.model.backbone)
    path = tmp_path / "ckpt" / "iter_0.pth"
    path.parent.mkdir()
    save_checkpoint(path, model, cfg, TINY_CLASSES, mean, std, step=0)
    return path, model.eval(), tiny_config(tiny_voc), mean, std


def test_sweep_and_pseudo_labels_match_reference(tiny_voc, random_checkpoint, tmp_path, capsys):
    path, model, cfg, mean, std = random_checkpoint
    out = tmp_path / "eval"
    args = [str(path), "--split", "train", "--bg-thresholds", "0.1:0.9:0.2", "--pseudo", "--save-pseudo",
            "--save-cams", "--out", str(out), "--data-root", str(tiny_voc), "--no-progress"]  # fmt: skip
    assert eval_cams_cli.main(args) == 0
    printed = capsys.readouterr().out
    report = json.loads((out / "cam_eval.json").read_text())

    # reference: the same CAMs, labels and thresholds, scored with numpy
    dataset = VOCSegDataset(cfg.data, mean, std, split="train")
    thresholds = [0.1, 0.3, 0.5, 0.7, 0.9]
    per_t = {t: [] for t in thresholds}
    par, every_pixel = PAR.from_config(cfg.par), []
    with torch.no_grad():
        for item in dataset:
            gt = item["mask"].numpy()
            present = [c for c in (1, 2) if (gt == c).any()]
            labels = torch.tensor([[float(c in present) for c in (1, 2)]])
            cam = multiscale_cam(model.cam, item["image"][None], labels, cfg.cam.scales)
            rgb = denormalize(item["image"][None], mean, std)
            single = refine_cams_with_par(rgb, cam, labels, (cfg.cam.infer_bg_thresh,), par, cfg.par.scale)[0, 0]
            every_pixel.append((single.numpy(), gt))
            saved = np.load(out / "cams" / f"{item['id']}.npy")
            assert saved.dtype == np.float16 and saved.shape == (2, *gt.shape)
            np.testing.assert_allclose(saved, cam[0].numpy(), atol=1e-3)
            for t in thresholds:
                per_t[t].append((cam_to_label(cam, labels, t)[0].numpy(), gt))
    sweep = {row["bg_thresh"]: row["mIoU"] for row in report["cam_sweep"]}
    assert sorted(sweep) == thresholds
    for t in thresholds:
        assert sweep[t] == pytest.approx(numpy_miou(per_t[t], 3), abs=0.01), t
    assert len(set(sweep.values())) > 1  # the sweep is not flat, so picking the best means something
    best = max(thresholds, key=lambda t: (sweep[t], -t))
    assert report["best"]["bg_thresh"] == best and report["best"]["mIoU"] == sweep[best]
    assert f"best CAM background threshold: {best:g}" in printed

    # pseudo labels: uncertain (255) pixels are excluded from scoring and their share is reported
    pairs, ignored, scored = [], 0, 0
    for image_id in dataset.ids:
        gt = read_mask(tiny_voc / "SegmentationClass" / f"{image_id}.png")
        pseudo = read_mask(out / "pseudo" / f"{image_id}.png")
        assert set(np.unique(pseudo)) <= {0, 1, 2, 255}
        valid = gt < 3
        ignored += int(((pseudo == 255) & valid).sum())
        scored += int(valid.sum())
        pairs.append((pseudo, np.where(pseudo == 255, 255, gt)))
    certain = report["pseudo_certain_pixels"]
    assert 0 < certain["ignored_fraction"] == pytest.approx(ignored / scored)
    assert certain["mIoU"] == pytest.approx(numpy_miou(pairs, 3), abs=0.01)
    # the paper-comparable number: single background plane, PAR, every pixel with ground truth scored
    assert report["pseudo_every_pixel"]["mIoU"] == pytest.approx(numpy_miou(every_pixel, 3), abs=0.01)
    assert report["pseudo_every_pixel"]["mIoU"] != certain["mIoU"]
    assert "certain pixels only" in printed and "comparable with the paper's Table 3" in printed
    assert report["num_images"] == 3 and report["classifier"] == "final" and report["split"] == "train"


def folder_state(folder):
    """Every file under ``folder`` with its size and modification time."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


def test_aux_classifier_and_errors_under_the_work_dir(tiny_voc, random_checkpoint, tmp_path, monkeypatch, capsys):
    path, *_ = random_checkpoint
    common = ["--bg-thresholds", "0.5", "--data-root", str(tiny_voc), "--no-progress"]
    monkeypatch.chdir(tmp_path)
    before = folder_state(path.parent)
    path.parent.chmod(0o555)  # read-only (root writes anyway: the file listing below is what is checked)
    try:
        assert eval_cams_cli.main([str(path), *common]) == 0
        assert eval_cams_cli.main([str(path), "--aux", *common]) == 0
        assert eval_cams_cli.main([str(path), "--work-dir", str(tmp_path / "w"), *common]) == 0
    finally:
        path.parent.chmod(0o755)
    assert folder_state(path.parent) == before
    work = tmp_path / "work_dirs" / "tiny_run"  # work_dirs/<name of the run that trained the checkpoint>
    assert sorted(p.name for p in work.iterdir()) == ["cam_eval_iter_0_train", "cam_eval_iter_0_train_aux"]
    final = json.loads((work / "cam_eval_iter_0_train" / "cam_eval.json").read_text())
    aux = json.loads((work / "cam_eval_iter_0_train_aux" / "cam_eval.json").read_text())
    assert (tmp_path / "w" / "cam_eval_iter_0_train" / "cam_eval.json").is_file()
    assert aux["classifier"] == "aux" and final["classifier"] == "final"
    assert aux["cam_sweep"][0]["mIoU"] != final["cam_sweep"][0]["mIoU"]
    assert "pseudo_certain_pixels" not in final and "pseudo_every_pixel" not in final
    capsys.readouterr()
    assert eval_cams_cli.main([str(path), "--no-progress"]) == 2  # the config's root does not exist
    assert "dataset root not found" in capsys.readouterr().err
    assert eval_cams_cli.main([str(path), "--bg-thresholds", "0.9:0.1:0.1", *common[2:]]) == 2


def test_batches_of_one_size_score_and_save_as_one_image_at_a_time(tiny_voc, random_checkpoint, tmp_path, monkeypatch):
    """``batch_size`` 3 over the train split resized to one size (images of 1, 1 and 2 classes: the batch's stacks are
    padded): the scores and the saved CAMs and pseudo labels those of batches of 1."""
    _, model, cfg, mean, std = random_checkpoint
    data = resized_copy(tiny_voc, tmp_path / "data", dict.fromkeys(read_split(tiny_voc / "ImageSets" /
                                                                              "Segmentation" / "train.txt"), (48, 40)))
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, root=str(data)))
    dataset = VOCSegDataset(cfg.data, mean, std, split="train")
    batches, real_cam = [], cam_eval.multiscale_cam

    def recording_cam(cam_fn, images, labels, scales, **options):
        batches.append(labels.sum(dim=1).tolist())  # the classes of each image of the batch
        return real_cam(cam_fn, images, labels, scales, **options)

    monkeypatch.setattr(cam_eval, "multiscale_cam", recording_cam)
    results, files = {}, {}
    for batch_size in (1, 3):
        batches.clear()
        out = tmp_path / str(batch_size)
        results[batch_size] = evaluate_cams(model, dataset, cfg, [0.3, 0.5], pseudo=True, cam_dir=out / "cams",
                                            pseudo_dir=out / "pseudo", progress=False, batch_size=batch_size).to_dict()
        files[batch_size] = {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*.*"))}
    assert batches == [[1, 1, 2]]
    assert results[3] == results[1] and results[1]["pseudo_every_pixel"]["mIoU"] > 0
    assert len(files[1]) == 6 and files[3].keys() == files[1].keys()
    for name, content in files[1].items():  # the masks byte for byte; the CAMs as rounded by other matrix blockings
        if name.suffix == ".png":
            assert files[3][name] == content, name
        else:
            got, expected = (np.load(io.BytesIO(f[name])).astype(np.float32) for f in (files[3], files[1]))
            np.testing.assert_allclose(got, expected, atol=1e-3)


class Applied(BaseException):
    """Raised by the stand-in of tools/eval_cams.py's apply_threads: the tool got there."""


def test_the_cpu_reads_the_images_itself_and_gives_the_model_every_thread(tiny_voc, random_checkpoint, monkeypatch):
    """On the CPU no loader process runs beside the model, and tools/eval_cams.py counts none when it sets the model's
    threads (a worker took a CPU from them on a 2-core machine: 34.1 / 34.4 s against 23.4 / 24.5 s,
    docs/benchmarks.md); on a GPU the config's data.num_workers decode, counted."""
    path, model, cfg, mean, std = random_checkpoint
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, num_workers=2))
    workers, real_loader = [], cam_eval.DataLoader

    def loader(*args, **kwargs):
        workers.append(kwargs["num_workers"])
        return real_loader(*args, **kwargs)

    monkeypatch.setattr(cam_eval, "DataLoader", loader)
    evaluate_cams(model, VOCSegDataset(cfg.data, mean, std, split="train"), cfg, [0.5], "cpu", progress=False)
    assert workers == [0]

    counted = []

    def apply_threads(threads, workers=0):
        counted.append(workers)
        raise Applied

    monkeypatch.setattr(eval_cams_cli, "apply_threads", apply_threads)
    for device in ("cpu", "cuda"):
        with pytest.raises(Applied):
            eval_cams_cli.main([str(path), "--device", device])
    assert counted == [0, 2]


@needs_fake_cuda
@pytest.mark.parametrize(("mode", "dtype", "device"), MODEL_PRECISIONS)
def test_the_cam_pass_runs_with_the_configured_precision(tiny_voc, random_checkpoint, monkeypatch, mode, dtype, device):
    """``infer.fp32_precision`` (the flags a GPU's cuBLAS and cuDNN read) and ``infer.dtype`` (bf16 autocast on a GPU,
    ignored on a CPU) hold while the CAMs are computed, not after."""
    _, model, cfg, mean, std = random_checkpoint
    cfg = dataclasses.replace(cfg, infer=dataclasses.replace(cfg.infer, fp32_precision=mode, dtype=dtype))
    seen = record_at_calls(monkeypatch, cam_eval, "multiscale_cam", model_precision_seen)
    before = model_precision_seen()
    dataset = VOCSegDataset(cfg.data, mean, std, split="train")
    with fake_cuda():  # CUDA autocast "available" on either device
        evaluate_cams(model.to(device), dataset, cfg, [0.5], device, progress=False)
    assert seen and set(seen) == {expected_precision(mode, dtype, device)}
    assert model_precision_seen() == before
