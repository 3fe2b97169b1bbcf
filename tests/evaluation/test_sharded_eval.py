"""tools/eval_cams.py and tools/test.py under torchrun (CPU ranks, gloo): each rank scores its share of the images,
the confusion matrices are summed across ranks, and every score equals the 1-process run's exactly; a rank whose
share is empty joins the sum and the job completes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import TINY_CLASSES, assert_same_files
from tools import eval_cams as eval_cams_cli
from tools import test as test_cli
from wsss.evaluation.folders import evaluate_folders
from wsss.evaluation.split_eval import score_masks
from wsss.utils.fileio import read_mask, save_mask

pytestmark = pytest.mark.usefixtures("one_thread")

REPO = Path(__file__).resolve().parents[2]
CAM_OPTS = ["--split", "train", "--bg-thresholds", "0.1:0.9:0.1", "--pseudo", "--save-pseudo", "--save-cams",
            "--no-progress", "--device", "cpu"]  # fmt: skip


def torchrun(ranks: int, *args: str) -> subprocess.CompletedProcess:
    """``ranks`` CPU processes under torchrun on a free port (``--standalone``); the run must succeed."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks), *args]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` by relative path."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [2, 4], ids=["2-ranks", "4-ranks-1-empty"])
def test_sharded_cam_eval_equals_one_process(checkpoint, tmp_path, capsys, ranks):
    """The sweep, both pseudo-label scores with the uncertain fraction, and every saved CAM and pseudo label of N
    ranks equal the 1-process run's; rank 0 alone prints. 3 images on 4 ranks: one share is empty."""
    _, ckpt = checkpoint
    single, sharded = tmp_path / "single", tmp_path / "sharded"
    # one thread, as each rank (OMP_NUM_THREADS=1): the saved float16 CAMs round with the threads' matrix blocking
    assert eval_cams_cli.main([str(ckpt), *CAM_OPTS, "--out", str(single), "--threads", "1"]) == 0
    assert capsys.readouterr().out.count("best CAM background threshold") == 1
    expected = files(single)
    report = json.loads(expected["cam_eval.json"])
    assert report["num_images"] == 3 and len({row["mIoU"] for row in report["cam_sweep"]}) > 1
    assert 0 < report["pseudo_certain_pixels"]["ignored_fraction"] < 1
    assert sorted(expected) == ["cam_eval.json", *(f"cams/{i}.npy" for i in ("a1", "a2", "b1")),
                                *(f"pseudo/{i}.png" for i in ("a1", "a2", "b1"))]  # fmt: skip

    proc = torchrun(ranks, "tools/eval_cams.py", str(ckpt), *CAM_OPTS, "--out", str(sharded), "--launcher", "pytorch")
    assert_same_files(files(sharded), expected)  # the JSON byte for byte, and every per-image file
    assert proc.stdout.count("best CAM background threshold") == 1
    assert proc.stdout.count(f"wrote {sharded / 'cam_eval.json'}") == 1


def scored(work: Path, masks: Path) -> dict[str, bytes]:
    """What tools/test.py wrote: metrics.json of the run folder under ``work``, without its ``predictions`` path,
    and the masks."""
    metrics = json.loads((next(work.iterdir()) / "metrics.json").read_text())
    metrics.pop("predictions")
    return {"metrics.json": json.dumps(metrics).encode(), **files(masks)}


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [2, 4], ids=["2-ranks", "4-ranks-1-empty-out-and-show-dir"])
def test_sharded_test_equals_one_process(checkpoint, tmp_path, capsys, ranks):
    """metrics.json (aAcc, mIoU, mAcc, per class) and the masks of tools/test.py on N ranks equal the 1-process
    run's; rank 0 alone prints and writes. 3 images on 4 ranks: one share of the scoring is empty; there the masks
    go to --out, copied from --show-dir by every rank for its share."""
    cfg_file, ckpt = checkpoint
    common = [str(cfg_file), str(ckpt), "--device", "cpu"]

    def outputs(folder: Path) -> tuple[list[str], Path]:
        """The options naming the output folders under ``folder``, and the folder of the masks."""
        args = ["--work-dir", str(folder / "work")]
        if ranks == 2:
            return args, folder / "work" / f"test_{ckpt.stem}" / "masks"
        return [*args, "--out", str(folder / "out"), "--show-dir", str(folder / "show")], folder / "out" / "masks"

    args, masks = outputs(tmp_path / "single")
    assert test_cli.main([*common, *args]) == 0
    assert capsys.readouterr().out.count("wrote ") == 1
    expected = scored(tmp_path / "single" / "work", masks)
    metrics = json.loads(expected["metrics.json"])
    assert sorted(expected) == ["a1.png", "a2.png", "b1.png", "metrics.json"]
    assert sum(v is not None for v in metrics["per_class"]["IoU"].values()) == 3 and 0 < metrics["mIoU"] < 100

    args, masks = outputs(tmp_path / "sharded")
    proc = torchrun(ranks, "tools/test.py", *common, *args, "--launcher", "pytorch")
    assert scored(tmp_path / "sharded" / "work", masks) == expected
    assert proc.stdout.count("wrote ") == 1 and proc.stdout.count("| background |") == 1


@pytest.mark.parametrize("tool", ["eval_cams", "test"])
def test_launcher_must_match_how_the_process_started(checkpoint, tmp_path, monkeypatch, capsys, tool):
    """--launcher pytorch without torchrun's environment, or none under torchrun's: one line, exit 2, nothing
    written."""
    cfg_file, ckpt = checkpoint
    out = tmp_path / "out"
    main, args = (
        (eval_cams_cli.main, [str(ckpt), *CAM_OPTS, "--out", str(out)])
        if tool == "eval_cams"
        else (test_cli.main, [str(cfg_file), str(ckpt), "--device", "cpu", "--work-dir", str(out)])
    )
    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    assert main([*args, "--launcher", "pytorch"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "torchrun" in err
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main([*args, "--launcher", "none"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "--launcher pytorch" in err
    assert main(args) == 2  # --launcher none is the default, as in mmseg
    assert "--launcher pytorch" in capsys.readouterr().err
    assert not out.exists()


def test_score_masks_equals_evaluate_folders_and_names_what_is_wrong(tiny_voc, tmp_path):
    """One process: the scores of tools/eval.py; an id without prediction or ground truth, and ground truth outside
    the classes, are refused naming the files."""
    gt_dir, pred_dir = tiny_voc / "SegmentationClass", tmp_path / "pred"
    ids = ["a1", "a2", "b1", "b2"]
    for k, image_id in enumerate(ids):  # predictions: the ground truth, shifted and with other classes painted in
        gt = read_mask(gt_dir / f"{image_id}.png")
        pred = np.roll(np.where(gt == 255, 0, gt), 3 + k, axis=1)
        pred[: 2 + k] = k % 3
        save_mask(pred_dir / f"{image_id}.png", pred.astype(np.uint8))
    got = score_masks(pred_dir, gt_dir, ids, TINY_CLASSES, 255, "cpu", 0, False)
    expected = evaluate_folders(pred_dir, gt_dir, 3, class_names=TINY_CLASSES, ids=ids, num_workers=0)
    assert got.to_dict() == expected.to_dict() and 0 < got["mIoU"] < 100

    (pred_dir / "a2.png").unlink()
    with pytest.raises(ValueError, match=r"1 of 4 ids of the split have no prediction in .*pred: a2$"):
        score_masks(pred_dir, gt_dir, ids, TINY_CLASSES, 255, "cpu", 0, False)
    with pytest.raises(ValueError, match=r"1 of 2 ids of the split have no ground truth in .*: zz$"):
        score_masks(pred_dir, gt_dir, ["a1", "zz"], TINY_CLASSES, 255, "cpu", 0, False)
    with pytest.raises(ValueError, match=r"1 ground-truth masks have labels outside \[0, 2\) other than 255: .*b1.png"):
        score_masks(pred_dir, gt_dir, ["a1", "b1"], TINY_CLASSES[:2], 255, "cpu", 0, False)  # b1 holds a dog (2)


EVAL_RANK = """
import sys
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from wsss.evaluation.split_eval import score_masks

dist.init_process_group("gloo", timeout=timedelta(seconds=60))
pred, gt, out = (Path(a) for a in sys.argv[1:4])
try:
    score_masks(pred, gt, ["a1", "a2", "b1"], sys.argv[4:], 255, "cpu", 0, False)
    said = "no error"
except Exception as err:  # what this rank raised
    said = f"{type(err).__name__}: {err}"
(out / f"rank{dist.get_rank()}.txt").write_text(said)
dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.parametrize("bad", ["labels", "size", "unreadable"])
def test_a_bad_ground_truth_on_one_rank_raises_the_same_line_on_every_rank(tiny_voc, tmp_path, bad):
    """Sharded scoring (2 ranks) where rank 1's one ground-truth mask holds a label outside the classes, has
    another size than its prediction, or is not an image: both ranks raise the same one-line ValueError naming the
    file, and neither waits for the other (the job ends; a rank left in the sum would hang or die in gloo)."""
    gt_dir, pred_dir, out = tmp_path / "gt", tmp_path / "pred", tmp_path / "said"
    out.mkdir()
    shutil.copytree(tiny_voc / "SegmentationClass", gt_dir)
    for image_id in ("a1", "a2", "b1"):
        save_mask(pred_dir / f"{image_id}.png", np.where(read_mask(gt_dir / f"{image_id}.png") == 255, 0, 1))
    broken = gt_dir / "a2.png"  # ids[1::2]: rank 1's share
    if bad == "labels":
        save_mask(broken, np.full_like(read_mask(broken), 7))
    elif bad == "size":
        save_mask(broken, read_mask(broken)[:-3])
    else:
        broken.write_bytes(b"not a png")
    script = tmp_path / "eval_rank.py"
    script.write_text(EVAL_RANK)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script),
           str(pred_dir), str(gt_dir), str(out), *TINY_CLASSES]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    said = [(out / f"rank{r}.txt").read_text() if (out / f"rank{r}.txt").is_file() else None for r in (0, 1)]
    assert said[0] == said[1], (said, proc.stderr[-2000:])
    assert said[0].startswith("ValueError: ") and "\n" not in said[0] and str(broken) in said[0], said[0]
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_a_bad_ground_truth_on_one_rank_stops_the_cam_eval_of_every_rank(checkpoint, tmp_path, workers):
    """tools/eval_cams.py on 2 ranks (decoding in the main process or in loader workers) where rank 1's mask is
    not an image: each rank prints the same one error line naming it and exits 2, neither waits for the other."""
    state = torch.load(checkpoint[1], weights_only=True)
    root = Path(state["config"]["data"]["root"])
    state["config"]["data"]["num_workers"] = workers
    ckpt = tmp_path / "decoding_in_workers.pth"
    torch.save(state, ckpt)
    broken = root / "SegmentationClass" / "a2.png"  # split train: a1 a2 b1, rank 1 scores a2
    broken.write_bytes(b"not a png")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "tools/eval_cams.py",
           str(ckpt), *CAM_OPTS, "--out", str(tmp_path / "out"), "--launcher", "pytorch"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    line = f"error: {broken}: not a readable mask (cannot identify image file '{broken}')"
    assert proc.stderr.count("error: ") == proc.stderr.count(line) == 2, proc.stderr[-3000:]  # the ranks may
    assert "Connection closed" not in proc.stderr and "Original Traceback" not in proc.stderr  # interleave lines
    assert not (tmp_path / "out" / "cam_eval.json").exists()
