"""tools/report.py: Tables 1-3 from what tools/test.py and eval_cams.py --pseudo wrote, each row with its protocol;
on VOC beside the paper's and ToCo's rows with the differences, on the toy set with its own classes only."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tools import eval_cams as eval_cams_cli
from tools import report as report_cli
from tools import test as test_cli
from wsss.data.classes import VOC_CLASSES
from wsss.evaluation.cam_eval import CamEvalResult
from wsss.evaluation.folders import save_metrics_json
from wsss.evaluation.metrics import SegMetrics
from wsss.evaluation.protocol import EvalProtocol
from wsss.utils.fileio import atomic_write_text

pytestmark = pytest.mark.usefixtures("one_thread")


def rows(report: dict, table: int) -> dict[str, list]:
    """Row name -> values of a table of report.json."""
    return {row["name"]: row["values"] for row in report["tables"][table]["rows"]}


def test_toy_report_has_its_own_classes_no_paper_row_and_every_protocol(checkpoint, tmp_path, capsys):
    """test.py and eval_cams.py print the protocol line and record it; the report's tables hold exactly their
    numbers under the toy classes, with the protocol of each row, and no published row."""
    cfg_file, ckpt = checkpoint
    work = tmp_path / "work"
    assert test_cli.main([str(cfg_file), str(ckpt), "--device", "cpu", "--work-dir", str(work)]) == 0
    out = capsys.readouterr().out
    line = ("protocol: checkpoint iter_0.pth (step 0); split train, 3 of 3 images: the full val split; scales (1), "
            "flip off, CRF off, mask_classes all, max_size 1024")  # fmt: skip
    assert line in out.splitlines()
    metrics = json.loads((work / "test_iter_0" / "metrics.json").read_text())
    assert metrics["protocol"]["line"] == line and metrics["protocol"]["full_val"] is True
    cam_args = [str(ckpt), "--split", "train", "--pseudo", "--no-progress", "--max-images", "2"]
    assert eval_cams_cli.main([*cam_args, "--work-dir", str(work)]) == 0
    cam_line = ("protocol: checkpoint iter_0.pth (step 0); split train, 2 of 3 images: NOT the full val split; "
                "scales (1, 0.5), flip on, CRF off, mask_classes ground-truth labels")  # fmt: skip
    assert capsys.readouterr().out.splitlines()[0] == cam_line
    cams = json.loads((work / "cam_eval_iter_0_train" / "cam_eval.json").read_text())
    assert cams["protocol"]["line"] == cam_line and cams["protocol"]["full_val"] is False

    assert report_cli.main([str(work)]) == 0
    printed = capsys.readouterr().out
    report = json.loads((work / "report.json").read_text())
    assert printed.startswith((work / "report.md").read_text()) and report["classes"] == ["background", "cat", "dog"]
    assert report["voc"] is False and "not VOC's" in report["notes"][0]
    assert rows(report, 0) == {"test_iter_0": [metrics["mIoU"], None]}
    iou = metrics["per_class"]["IoU"]
    assert report["tables"][1]["columns"] == ["background", "cat", "dog", "mIoU"]
    assert rows(report, 1) == {"test_iter_0": [iou["background"], iou["cat"], iou["dog"], metrics["mIoU"]]}
    certain = cams["pseudo_certain_pixels"]
    expected = [cams["pseudo_every_pixel"]["mIoU"], certain["mIoU"], 100 * certain["ignored_fraction"]]
    assert rows(report, 2) == {"cam_eval_iter_0_train": expected}
    assert f"| test_iter_0 | {metrics['mIoU']:.2f} |  |" in printed
    assert f"- test_iter_0: {line} ({work / 'test_iter_0' / 'metrics.json'})" in printed
    assert f"- cam_eval_iter_0_train: {cam_line}" in printed
    assert "| paper |" not in printed and "ToCo" not in printed


def voc_protocol(split: str, num_images: int, split_images: int, **kw) -> dict:
    """The protocol of a multi-scale + flip + CRF run on VOC."""
    settings = {"scales": (1.0, 0.5, 1.5), "flip": True, "crf": True, "mask_classes": "present", "max_size": 1024}
    return EvalProtocol(checkpoint="work_dirs/voc_centered/iter_80000.pth", step=80000, split=split,
                        num_images=num_images, split_images=split_images, val_split="val", voc=True,
                        **{**settings, **kw}).to_dict()  # fmt: skip


def voc_metrics(miou: float, iou: np.ndarray) -> SegMetrics:
    return SegMetrics({"aAcc": 90.0, "mIoU": miou, "mAcc": 80.0}, {"IoU": iou, "Acc": iou + 1}, list(VOC_CLASSES))


@pytest.fixture
def voc_work(tmp_path: Path) -> Path:
    """A VOC work dir as the tools write it: the full val set, a val subset, pseudo labels on train, a test
    submission, and a metrics.json of an older version without protocol."""
    work = tmp_path / "voc"
    iou = np.linspace(60.0, 80.0, 21)
    iou[9] = np.nan  # a class absent from the scored images
    save_metrics_json(voc_metrics(70.25, iou), work / "test_iter_80000_tta" / "metrics.json",
                      protocol=voc_protocol("val", 1449, 1449))  # fmt: skip
    save_metrics_json(voc_metrics(75.0, iou), work / "test_iter_80000_part" / "metrics.json",
                      protocol=voc_protocol("val", 1000, 1449))  # fmt: skip
    save_metrics_json(voc_metrics(1.0, iou), work / "test_old" / "metrics.json")
    pseudo = voc_metrics(75.5, iou)
    info = {"protocol": voc_protocol("train", 1464, 1464, mask_classes="ground-truth labels")}
    cams = CamEvalResult([0.5], {0.5: voc_metrics(50.0, iou)}, 1464, voc_metrics(80.0, iou), 0.25, pseudo, info)
    atomic_write_text(work / "cam_eval_iter_80000_train" / "cam_eval.json", json.dumps(cams.to_dict()))
    submission = {"protocol": voc_protocol("test", 1456, 1456, scored=False), "archive": "sub/results.tar.gz"}
    atomic_write_text(work / "test_iter_80000_test_tta" / "submission.json", json.dumps(submission))
    return work


def test_voc_report_sets_the_paper_and_toco_rows_beside_ours_with_the_differences(voc_work, capsys):
    assert report_cli.main([str(voc_work), "--test-miou", "71.4"]) == 0
    printed = capsys.readouterr().out
    report = json.loads((voc_work / "report.json").read_text())
    assert report["voc"] is True and len(report["classes"]) == 21
    table1 = rows(report, 0)
    assert table1["paper"] == [72.5, 72.9] and table1["ToCo"] == [71.1, 72.2]
    assert table1["test_iter_80000_tta"] == [70.25, None]
    assert table1["test_iter_80000_tta - paper"] == pytest.approx([-2.25, None])
    assert table1["test_iter_80000_tta - ToCo"] == pytest.approx([-0.85, None])
    assert table1["test_iter_80000_test_tta"] == [None, 71.4]
    assert table1["test_iter_80000_test_tta - paper"] == pytest.approx([None, -1.5])
    assert "| test_iter_80000_tta - paper | -2.25 |  |" in printed and "| paper | 72.5 | 72.9 |" in printed

    table2 = rows(report, 1)
    columns = report["tables"][1]["columns"]
    assert columns[:3] == ["bkg", "aero", "bicycle"] and columns[-1] == "mIoU" and len(columns) == 22
    assert table2["paper"][:3] == [89.3, 81.1, 61.2] and table2["paper"][-1] == 72.5
    assert table2["ToCo"][-2:] == [63.1, 71.1]
    ours = table2["test_iter_80000_tta"]
    assert ours[9] is None and ours[0] == 60.0 and ours[-1] == 70.25
    assert table2["test_iter_80000_tta - paper"][0] == pytest.approx(60.0 - 89.3)
    assert table2["test_iter_80000_tta - paper"][9] is None  # our absent class: no difference

    table3 = rows(report, 2)
    assert table3["paper"] == [74.1, None, None] and table3["ToCo"] == [73.6, None, None]
    assert table3["cam_eval_iter_80000_train"] == [75.5, 80.0, 25.0]
    assert table3["cam_eval_iter_80000_train - paper"] == pytest.approx([1.4, None, None])
    assert "| paper | 74.1 |  |  |" in printed

    assert "split val, 1449 of 1449 images: the full VOC val set (1449 images); scales (1, 0.5, 1.5), flip on, " \
        "CRF on, mask_classes present" in printed
    assert "split val, 1000 of 1449 images: NOT the full VOC val set (1449 images)" in printed
    assert "split test, 1456 of 1456 images: the full VOC test set (1456 images), not scored" in printed
    assert "mIoU from the VOC server (--test-miou)" in printed
    notes = " ".join(report["notes"])
    assert "certain pixels only" in notes and "averages to 75.7" in notes
    assert f"left out {voc_work / 'test_old' / 'metrics.json'}: it records no protocol" in notes


def test_an_unscored_submission_says_how_to_score_it(voc_work, capsys):
    assert report_cli.main([str(voc_work), "--out", str(voc_work / "r")]) == 0
    report = json.loads((voc_work / "r" / "report.json").read_text())
    assert rows(report, 0)["test_iter_80000_test_tta"] == [None, None]
    assert "not scored yet: upload sub/results.tar.gz, then rerun with --test-miou" in capsys.readouterr().out


def test_bad_input_gives_one_line(voc_work, tmp_path, capsys):
    second = voc_work / "test_other_val" / "submission.json"  # --format-only on val: its mIoU goes to val
    atomic_write_text(second, json.dumps({"protocol": voc_protocol("val", 1449, 1449, scored=False), "archive": "a"}))
    broken = tmp_path / "broken"
    (broken / "a").mkdir(parents=True)
    (broken / "a" / "metrics.json").write_text('{"mIoU": 1')
    (broken / "b").mkdir()
    (broken / "b" / "cam_eval.json").write_text('{"protocol": {"split": "val"}, "pseudo_every_pixel": {}}')
    cases = {
        (str(broken / "a"),): f"{broken / 'a' / 'metrics.json'} is not JSON",
        (str(broken / "b"),): f"{broken / 'b' / 'cam_eval.json'}: protocol without checkpoint, step",
        (str(tmp_path / "nowhere"),): "work dir not found",
        (str(voc_work / "test_old"),): "no result with a protocol",
        (str(voc_work), "--test-miou", "71"): "give --submission DIR",
        (str(voc_work), "--test-miou", "171", "--submission", str(second.parent)): "a percentage in [0, 100]",
    }
    for args, message in cases.items():
        assert report_cli.main(list(args)) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err
    assert report_cli.main([str(voc_work), "--test-miou", "70", "--submission", str(second.parent)]) == 0
    assert rows(json.loads((voc_work / "report.json").read_text()), 0)["test_other_val"] == [70.0, None]
