"""tools/report.py: Tables 1-3 from what tools/test.py and eval_cams.py --pseudo wrote, each row with its protocol;
on VOC beside the paper's and ToCo's rows with the differences, on the toy set with its own classes only."""

from __future__ import annotations

import errno
import json
import os
import re
import threading
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
    second = voc_work / "test_other_val" / "submission.json"  # --format-only on val: the server scores test only
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
        (str(voc_work), "--test-miou", "70", "--submission", str(second.parent)): (
            f"found none; {second} is of split val: run tools/test.py --format-only on the test split first"),
        (str(voc_work), "--test-miou", "171"): "a percentage in [0, 100]",
        (str(voc_work), "--test-miou", "nan"): "a percentage in [0, 100]",
    }
    for args, message in cases.items():
        assert report_cli.main(list(args)) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err
    assert report_cli.main([str(voc_work), "--test-miou", "71"]) == 0  # the one test-split submission
    table1 = rows(json.loads((voc_work / "report.json").read_text()), 0)
    assert table1["test_iter_80000_test_tta"] == [None, 71.0] and table1["test_other_val"] == [None, None]
    second_test = voc_work / "test_again" / "submission.json"
    atomic_write_text(second_test, json.dumps({"protocol": voc_protocol("test", 1456, 1456, scored=False),
                                               "archive": "b"}))  # fmt: skip
    assert report_cli.main([str(voc_work), "--test-miou", "71"]) == 2
    assert "give --submission DIR of the one the server scored" in capsys.readouterr().err


def test_a_test_miou_needs_a_test_split_submission(tmp_path, capsys):
    """The issue's case: --format-only on val, then --test-miou 55.5 put 55.5 in the val column without a word."""
    work = tmp_path / "work"
    val = work / "test_iter_600_val" / "submission.json"
    atomic_write_text(val, json.dumps({"protocol": voc_protocol("val", 1449, 1449, scored=False), "archive": "a"}))
    assert report_cli.main([str(work), "--test-miou", "55.5"]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: --test-miou needs the submission.json of tools/test.py --format-only on the test split, "
                   f"found none; {val} is of split val: run tools/test.py --format-only on the test split first, and "
                   "upload its archive\n")  # fmt: skip
    assert not (work / "report.md").exists()


def voc_cam_eval(path: Path, **certain) -> None:
    """A cam_eval.json of pseudo labels on VOC train, the certain pixels' entries replaced by ``certain``."""
    iou = np.linspace(60.0, 80.0, 21)
    info = {"protocol": voc_protocol("train", 1464, 1464, mask_classes="ground-truth labels")}
    scores = voc_metrics(75.5, iou)
    data = CamEvalResult([0.5], {0.5: scores}, 1464, voc_metrics(80.0, iou), 0.25, scores, info).to_dict()
    data["pseudo_certain_pixels"].update(certain)
    atomic_write_text(path, json.dumps(data))


def test_a_nan_uncertain_share_is_an_empty_cell(tmp_path, capsys):
    """No pixel scored (an empty split): the share is NaN, written as an empty cell and as null in report.json."""
    work = tmp_path / "work"
    voc_cam_eval(work / "cam_eval_iter_1_train" / "cam_eval.json", ignored_fraction=float("nan"))
    assert report_cli.main([str(work)]) == 0
    assert "| cam_eval_iter_1_train | 75.50 | 80.00 |  |" in capsys.readouterr().out
    strict = json.loads((work / "report.json").read_text(), parse_constant=lambda name: pytest.fail(name))
    assert rows(strict, 2)["cam_eval_iter_1_train"] == [75.5, 80.0, None]


def deep(path: Path) -> Path:
    """A metrics.json nested 100,000 lists deep: valid JSON past Python's recursion limit."""
    return write(path, "[" * 100_000 + "]" * 100_000)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def metrics(path: Path, **changes) -> Path:
    """A metrics.json of a VOC run with top-level entries replaced by ``changes`` (None: removed)."""
    save_metrics_json(voc_metrics(70.0, np.linspace(60.0, 80.0, 21)), path, protocol=voc_protocol("val", 1449, 1449))
    data = json.loads(path.read_text())
    data.update(changes)
    return write(path, json.dumps({k: v for k, v in data.items() if v is not None}))


WRONG_SHAPES = {
    "a list": (lambda d: write(d / "metrics.json", "[1, 2]"),
               "metrics.json: a JSON list, not the object tools/test.py writes: rerun it, or move the file away"),
    "no mIoU": (lambda d: metrics(d / "metrics.json", mIoU=None),
                "metrics.json: no 'mIoU', where tools/test.py writes a number: rerun it, or move the file away"),
    "mIoU abc": (lambda d: metrics(d / "metrics.json", mIoU="abc"),
                 "metrics.json: 'abc' as 'mIoU', where tools/test.py writes a number: rerun it"),
    "no per_class": (lambda d: metrics(d / "metrics.json", per_class=None),
                     "metrics.json: no 'per_class.IoU', where tools/test.py writes class names -> numbers"),
    "per_class a list": (lambda d: metrics(d / "metrics.json", per_class={"IoU": [1.0]}),
                         "metrics.json: [1.0] as 'per_class.IoU', where tools/test.py writes class names -> numbers"),
    "no certain pixels": (lambda d: write(d / "cam_eval.json", json.dumps({
        "protocol": voc_protocol("train", 1464, 1464), "pseudo_every_pixel": {"mIoU": 1.0, "per_class": {"IoU": {}}}})),
        "cam_eval.json: no 'pseudo_certain_pixels.mIoU', where tools/eval_cams.py --pseudo writes a number"),
    "share abc": (lambda d: voc_cam_eval(d / "cam_eval.json", ignored_fraction="abc") or d / "cam_eval.json",
                  "cam_eval.json: 'abc' as 'pseudo_certain_pixels.ignored_fraction', where tools/eval_cams.py "
                  "--pseudo writes a number or nothing"),
    "deep nesting": (lambda d: deep(d / "metrics.json"), "metrics.json is not JSON (maximum recursion depth exceeded"),
    "a protocol split of 5": (lambda d: metrics(d / "metrics.json", protocol={**voc_protocol("val", 1, 1), "split": 5}),
                              "metrics.json: protocol 'split' is 5, not str: rerun tools/test.py"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(WRONG_SHAPES))
def test_a_result_file_of_the_wrong_shape_is_named_in_one_line(tmp_path, capsys, case):
    """Valid JSON of the wrong shape (or no file at all) ended in AttributeError, KeyError, RecursionError, an error
    naming no file, or a read that never returned; each is now one line naming the file and what to do."""
    make, message = WRONG_SHAPES[case]
    path = make(tmp_path / "work" / "run")
    assert report_cli.main([str(tmp_path / "work")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path.parent / message}") and err.count("\n") == 1, err


def test_a_fifo_named_like_a_result_is_refused_without_waiting(tmp_path, capsys):
    """Reading a named pipe waits for a writer, for ever: the report looks at what the file is first."""
    path = tmp_path / "work" / "run" / "metrics.json"
    path.parent.mkdir(parents=True)
    os.mkfifo(path)
    writer = threading.Thread(target=lambda: open(path, "w").close(), daemon=True)
    writer.start()  # ends a read that waits (the old code's, which then found no JSON), so the test ends either way
    assert report_cli.main([str(tmp_path / "work")]) == 2
    assert capsys.readouterr().err == (f"error: {path}: not a regular file (named pipe), not the result file "
                                       "tools/test.py writes: move it away\n")  # fmt: skip
    os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))  # the writer's open returns
    writer.join(10)


def test_a_full_out_folder_names_the_file(voc_work, capsys, monkeypatch):
    def full(path, text):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr("wsss.evaluation.report.atomic_write_text", full)
    out = voc_work / "out"
    assert report_cli.main([str(voc_work), "--out", str(out)]) == 2
    assert capsys.readouterr().err == (f"error: cannot write {out / 'report.md'} (No space left on device): free "
                                       "space there, or give --out a folder you can write to\n")  # fmt: skip


def test_the_report_cites_the_paper_by_title_and_only_files_of_the_repository(voc_work, capsys):
    """report.md once cited papers/centered_self_attention.md and DESIGN.md, which a clone does not hold."""
    assert report_cli.main([str(voc_work)]) == 0
    text = (voc_work / "report.md").read_text()
    assert "Centered Self-Attention Layers (arXiv 2306.01610)" in text
    cited = set(re.findall(r"(?<![\w/.-])(?!/)[\w./-]+\.(?:md|py)\b", text)) - {"report.md"}
    assert {"wsss/evaluation/paper_tables.py", "docs/design.md"} <= cited
    repository = Path(__file__).resolve().parents[2]
    assert [name for name in sorted(cited) if not (repository / name).is_file()] == []
