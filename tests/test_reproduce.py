"""The chain of ``make reproduce`` (wsss/reproduce.py, tools/reproduce.py): stage order, times, resume, failures.

The end-to-end test runs every tool on a generated toy set with a 3-block ViT for 2 iterations; it calls each tool's
``main`` in this process (a subprocess per stage would pay a torch import each). :func:`run_command`, which runs
them as processes, is tested on its own.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from tools import reproduce as reproduce_cli
from wsss import reproduce
from wsss.config import ConfigError
from wsss.reproduce import Chain, plan_chain, run_chain, run_command

TINY = [  # tests/conftest.py's tiny_config: seconds per stage on a CPU
    "data.crop_size=32", "data.num_workers=0", "model.backbone_kwargs.depth=3", "model.backbone_kwargs.embed_dim=32",
    "model.backbone_kwargs.num_heads=2", "model.backbone_kwargs.patch_size=8", "model.decoder_channels=16",
    "model.aux_layer=-2", "par.num_iter=2", "par.dilations=[1,2]", "train.max_iters=2", "train.batch_size=2",
    "train.ckpt_interval=1", "train.log_interval=1",
]  # fmt: skip
NAMES = ["prepare", "train", "test --tta --crf", "eval_cams --pseudo", "report"]


def in_process(command, log: Path) -> int:
    """Run ``python tools/X.py ARGS`` as ``tools.X.main(ARGS)``, its output appended to ``log``."""
    module = importlib.import_module(f"tools.{Path(command[1]).stem}")
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as sink, redirect_stdout(sink), redirect_stderr(sink):
        return module.main(list(command[2:]))


class Recorder:
    """A runner that records the tool of each command and runs it with ``run`` (default: it writes the stage's
    outputs); the tool ``fail`` exits 2 once, the tool ``interrupt`` is interrupted by Ctrl-C."""

    def __init__(self, chain: Chain, run=None, fail: str | None = None, interrupt: str | None = None):
        self.outputs = {stage.commands[-1]: stage.outputs for stage in chain.stages}
        self.run, self.fail, self.interrupt, self.calls = run, fail, interrupt, []

    def __call__(self, command, log: Path) -> int:
        tool = Path(command[1]).stem
        self.calls.append(tool)
        if tool == self.interrupt:
            raise KeyboardInterrupt
        if tool == self.fail:
            self.fail = None
            return 2
        if self.run is not None:
            return self.run(command, log)
        for path in self.outputs.get(tuple(command), ()):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("made\n")
        return 0


def toy_chain(tmp_path: Path, *options: str, device: str = "cpu") -> Chain:
    return plan_chain("toy", tmp_path / "data", work_dir=tmp_path / "work", cfg_options=[*TINY, *options],
                      device=device, num_train=4, num_val=2)  # fmt: skip


def statuses(result) -> list[str]:
    return [s["status"] for s in result.stages]


def test_the_stages_run_the_tools_in_order_with_the_papers_protocol(tmp_path):
    chain = plan_chain("voc", tmp_path / "data", work_dir=tmp_path / "work", device="cpu", archives=tmp_path / "a")
    assert [s.name for s in chain.stages] == NAMES
    commands = [shlex.join(c[1:]) for s in chain.stages for c in s.commands]
    data, work, voc = tmp_path / "data", tmp_path / "work", tmp_path / "data" / "VOCdevkit" / "VOC2012"
    ckpt = work / "iter_80000.pth"  # configs/voc_centered.py: 80k iterations
    assert commands[0] == f"tools/prepare_data.py voc {data} --archives {tmp_path / 'a'}"
    assert commands[1].startswith(f"tools/train.py configs/voc_centered.py --work-dir {work} --resume --device cpu")
    assert commands[1].endswith(f"--cfg-options data.root={voc}")
    assert commands[2].startswith(f"tools/test.py configs/voc_centered.py {ckpt} --work-dir {work} --tta --crf")
    assert commands[3] == (f"tools/eval_cams.py {ckpt} --split train --pseudo --out {work}/cam_eval_iter_80000_train "
                           f"--data-root {voc} --device cpu")  # fmt: skip
    assert commands[4] == f"tools/report.py {work}"
    assert chain.stages[2].outputs == (work / "test_iter_80000_tta_crf" / "metrics.json",)  # where test.py writes
    toy = toy_chain(tmp_path)
    assert [Path(c[1]).name for c in toy.stages[0].commands] == ["make_toy_voc.py", "make_cls_labels.py"]
    assert "--num-train 4 --num-val 2" in shlex.join(toy.stages[0].commands[0])
    assert toy.stages[1].outputs == (tmp_path / "work" / "iter_2.pth",)


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"dataset": "toy", "archives": "a"}, "--archives applies to the voc chain only"),
        ({"dataset": "voc", "num_train": 3}, "--num-train applies to the toy chain only"),
        ({"dataset": "toy", "cfg_options": ["data.root=x"]}, "give --data-root ROOT instead"),
    ],
)
def test_options_of_the_other_chain_are_refused(tmp_path, kwargs, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        plan_chain(data_root=tmp_path, device="cpu", **kwargs)


def test_cli_refuses_a_bad_option_in_one_line_before_any_stage(tmp_path, capsys):
    assert reproduce_cli.main(["toy", "--work-dir", str(tmp_path), "--cfg-options", "train.max_iter=3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "train.max_iters" in err and err.count("\n") == 1
    assert not (tmp_path / "reproduce.json").exists()
    with pytest.raises(ConfigError):
        plan_chain("toy", tmp_path, cfg_options=["train.max_iters=-1"], device="cpu")


def test_each_stage_prints_its_time_and_the_record_keeps_them(tmp_path, capsys):
    chain = toy_chain(tmp_path)
    runner = Recorder(chain)
    result = run_chain(chain, runner)
    out = capsys.readouterr().out
    assert result.returncode == 0 and statuses(result) == ["ran"] * 5
    assert runner.calls == ["make_toy_voc", "make_cls_labels", "train", "test", "eval_cams", "report"]
    starts = [out.index(f"[{i}/5] {name} ...") for i, name in enumerate(NAMES, 1)]
    ends = [re.search(rf"^\[{i}/5\] {re.escape(name)}: \d+\.\d s$", out, re.M).start() for i, name in
            enumerate(NAMES, 1)]  # fmt: skip
    assert starts == sorted(starts) and all(s < e for s, e in zip(starts, ends, strict=True))
    table = out[out.index("stage ") :]
    for i, name in enumerate(NAMES, 1):
        assert re.search(rf"^\[{i}/5\] {re.escape(name)} +ran +\d+\.\d$", table, re.M), name
    assert re.search(r"^total, this run +\d+\.\d$", table, re.M)
    record = json.loads(chain.record.read_text())
    assert list(record["stages"]) == NAMES
    assert all(record["stages"][n]["seconds"] >= 0 for n in NAMES)
    assert [(s["stage"], s["status"]) for s in record["last_run"]["stages"]] == [(n, "ran") for n in NAMES]


def test_a_second_run_skips_every_stage(tmp_path, capsys):
    chain = toy_chain(tmp_path)
    run_chain(chain, Recorder(chain))
    capsys.readouterr()
    again = Recorder(chain)
    result = run_chain(chain, again)
    out = capsys.readouterr().out
    assert again.calls == [] and statuses(result) == ["skipped"] * 5
    assert all(f"[{i}/5] {name}: finished before, skipped" in out for i, name in enumerate(NAMES, 1))


def test_a_failing_stage_stops_the_chain_in_one_line_and_the_next_run_resumes_there(tmp_path, capsys):
    chain = toy_chain(tmp_path)
    runner = Recorder(chain, fail="eval_cams")
    result = run_chain(chain, runner)
    out = capsys.readouterr().out
    assert runner.calls[-1] == "eval_cams" and statuses(result) == ["ran"] * 3 + ["failed", "not run"]
    error = out.rstrip().splitlines()[-1]
    command = shlex.join(chain.stages[3].commands[0])
    log = tmp_path / "work" / "reproduce_logs" / "4_eval_cams.log"
    assert error == f"error: [4/5] eval_cams --pseudo failed (exit 2); rerun it with: {command} (log: {log})"
    assert result.returncode == 1 and result.error == error
    record = json.loads(chain.record.read_text())
    assert list(record["stages"]) == NAMES[:3] and record["last_run"]["stages"][3]["status"] == "failed"
    again = Recorder(chain)
    assert run_chain(chain, again).returncode == 0
    assert again.calls == ["eval_cams", "report"]


def test_a_stage_without_its_record_runs_again_with_every_later_one(tmp_path):
    chain = toy_chain(tmp_path)
    run_chain(chain, Recorder(chain))
    record = json.loads(chain.record.read_text())
    del record["stages"]["test --tta --crf"]
    chain.record.write_text(json.dumps(record))
    again = Recorder(chain)
    result = run_chain(chain, again)
    assert again.calls == ["test", "eval_cams", "report"]
    assert statuses(result) == ["skipped", "skipped", "ran", "ran", "ran"]


def test_a_stage_whose_output_is_gone_runs_again(tmp_path):
    chain = toy_chain(tmp_path)
    run_chain(chain, Recorder(chain))
    chain.stages[1].outputs[0].unlink()  # the final checkpoint
    again = Recorder(chain)
    run_chain(chain, again)
    assert again.calls == ["train", "test", "eval_cams", "report"]


def test_changed_settings_run_a_stage_again_another_device_does_not(tmp_path):
    chain = toy_chain(tmp_path)
    run_chain(chain, Recorder(chain))
    other_device = toy_chain(tmp_path, device="cuda")
    assert run_chain(other_device, Recorder(other_device)).stages[1]["status"] == "skipped"
    other_split = plan_chain("toy", tmp_path / "data", work_dir=tmp_path / "work", cfg_options=TINY, device="cpu",
                             num_train=5, num_val=2)  # fmt: skip
    again = Recorder(other_split)
    run_chain(other_split, again)
    assert again.calls == ["make_toy_voc", "make_cls_labels", "train", "test", "eval_cams", "report"]


def test_a_finished_training_with_other_settings_is_refused_not_resumed(tmp_path, capsys):
    """``train --resume`` on a finished run with another learning rate trains nothing and keeps the old weights:
    the report would show them under the new settings."""
    chain = toy_chain(tmp_path)
    run_chain(chain, Recorder(chain))
    other_lr = toy_chain(tmp_path, "optim.lr=0.002")
    again = Recorder(other_lr)
    result = run_chain(other_lr, again)
    assert again.calls == [] and result.returncode == 1
    assert statuses(result) == ["skipped", "not run", "not run", "not run", "not run"]
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith(f"error: [2/5] train: {tmp_path / 'work'} holds a run finished with other settings")
    longer = toy_chain(tmp_path, "train.max_iters=5")  # the README's way to extend a finished run
    resumed = Recorder(longer)
    assert run_chain(longer, resumed).returncode == 0 and resumed.calls == ["train", "test", "eval_cams", "report"]
    (tmp_path / "data" / "toy_voc" / "cls_labels.json").unlink()  # prepare runs again first: still refused
    assert run_chain(other_lr, again).returncode == 1 and again.calls == ["make_toy_voc", "make_cls_labels"]
    assert last.endswith(f"give --work-dir for a new run, or delete {tmp_path / 'work'} to train anew")


def test_a_stage_that_exits_0_without_its_outputs_fails(tmp_path, capsys):
    chain = toy_chain(tmp_path)
    result = run_chain(chain, Recorder(chain, run=lambda command, log: 0))
    assert statuses(result) == ["failed"] + ["not run"] * 4
    assert result.error.startswith("error: [1/5] prepare exited 0 but did not write ")
    assert json.loads(chain.record.read_text())["stages"] == {}


def test_an_interrupted_stage_is_recorded_and_resumed(tmp_path, capsys):
    chain = toy_chain(tmp_path)
    run_chain(chain, Recorder(chain))
    chain.stages[1].outputs[0].unlink()  # training runs again, and is interrupted
    with pytest.raises(KeyboardInterrupt):
        run_chain(chain, Recorder(chain, interrupt="train"))
    assert "interrupted during [2/5] train; run the same command again to resume" in capsys.readouterr().out
    record = json.loads(chain.record.read_text())
    assert list(record["stages"]) == ["prepare"]  # the later stages' records went when training started again
    assert [s["status"] for s in record["last_run"]["stages"]] == ["skipped", "interrupted"] + ["not run"] * 3
    again = Recorder(chain)
    run_chain(chain, again)
    assert again.calls == ["train", "test", "eval_cams", "report"]


def test_a_corrupt_record_is_named_with_the_fix(tmp_path):
    chain = toy_chain(tmp_path)
    chain.record.parent.mkdir(parents=True)
    chain.record.write_text("{not json")
    with pytest.raises(ValueError, match=r"reproduce.json is not the chain's record .*delete it"):
        run_chain(chain, Recorder(chain))


def test_run_command_logs_the_output_and_returns_the_status(tmp_path, capsys):
    log = tmp_path / "logs" / "1_x.log"
    code = "import sys; print('to stdout'); print('to stderr', file=sys.stderr); sys.exit(3)"
    assert run_command([sys.executable, "-c", code], log) == 3
    text = log.read_text()
    assert "to stdout" in text and "to stderr" in text and text.startswith("=== ")
    assert "to stdout" in capsys.readouterr().out
    assert run_command([sys.executable, "-c", "print('quiet')"], log, echo=False) == 0
    assert "quiet" in log.read_text() and "quiet" not in capsys.readouterr().out
    assert log.read_text().count("=== ") == 2  # appended
    run_command([sys.executable, "-c", "print('a progress bar', end='')"], log)
    assert capsys.readouterr().out == "a progress bar\n"  # the chain's next line starts on a line of its own


def test_the_toy_chain_end_to_end(tmp_path, capsys, one_thread):
    """Every tool for real: a stage that fails stops the chain, the next run resumes there and writes the report, a
    third run skips every stage, and a training interrupted after its first checkpoint resumes from it."""
    chain = toy_chain(tmp_path)
    work = tmp_path / "work"
    blocker = work / "cam_eval_iter_2_train"  # a file where eval_cams makes its folder: it fails
    blocker.parent.mkdir(parents=True)
    blocker.write_text("in the way\n")
    result = run_chain(chain, Recorder(chain, run=in_process))
    assert statuses(result) == ["ran"] * 3 + ["failed", "not run"], capsys.readouterr().out
    assert "error: [4/5] eval_cams --pseudo failed (exit 2)" in result.error
    assert "error:" in (work / "reproduce_logs" / "4_eval_cams.log").read_text()
    assert not (work / "report.md").exists()

    blocker.unlink()
    capsys.readouterr()
    result = run_chain(chain, Recorder(chain, run=in_process))
    out = capsys.readouterr().out
    assert statuses(result) == ["skipped"] * 3 + ["ran"] * 2, out
    report = (work / "report.md").read_text()
    for table in ("Table 1: segmentation mIoU", "Table 2: per-class IoU", "Table 3: pseudo labels"):
        assert table in report
    assert "test_iter_2_tta_crf" in report and "cam_eval_iter_2_train" in report
    assert "scales (1, 1.25, 1.5), flip on, CRF on" in report  # the test stage ran --tta --crf
    assert re.search(r"^\[5/5\] report: \d+\.\d s$", out, re.M)
    times = json.loads(chain.record.read_text())["stages"]
    assert all(times[name]["seconds"] >= 0 for name in NAMES)  # the report takes < 5 ms: 0.0 at 2 decimals
    assert all(times[name]["seconds"] > 0 for name in NAMES[:4])

    third = Recorder(chain, run=in_process)
    assert statuses(run_chain(chain, third)) == ["skipped"] * 5 and third.calls == []

    for name in ("iter_2.pth", "iter_2.pth.sha256"):  # as a training killed after its first checkpoint leaves it
        (work / name).unlink()
    (work / "last_checkpoint").write_text("iter_1.pth\n")
    result = run_chain(chain, Recorder(chain, run=in_process))
    assert statuses(result) == ["skipped"] + ["ran"] * 4
    assert f"resuming from {work / 'iter_1.pth'} at iteration 1" in (work / "log.txt").read_text()
    metrics = json.loads((work / "test_iter_2_tta_crf" / "metrics.json").read_text())
    assert metrics["protocol"]["step"] == 2


@pytest.mark.slow
def test_cli_runs_the_chain_as_processes(tmp_path):
    """``python tools/reproduce.py toy`` as a user runs it: every stage a process, then a second run that skips all."""
    repo = Path(__file__).resolve().parents[1]
    data, work = str(tmp_path / "data"), str(tmp_path / "work")
    args = [sys.executable, "tools/reproduce.py", "toy", "--data-root", data, "--work-dir", work, "--num-train", "4",
            "--num-val", "2", "--device", "cpu", "--cfg-options", *TINY]  # fmt: skip
    run = subprocess.run(args, cwd=repo, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "Table 3: pseudo labels" in (tmp_path / "work" / "report.md").read_text()
    assert re.search(r"^\[4/5\] eval_cams --pseudo: \d+\.\d s$", run.stdout, re.M)
    again = subprocess.run([*args, "--quiet"], cwd=repo, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and again.stdout.count("finished before, skipped") == 5, again.stdout


def test_checksums_go_to_the_prepare_stage_and_another_file_reruns_nothing(tmp_path, capsys):
    def voc_chain(checksums: Path | None) -> Chain:
        return plan_chain("voc", tmp_path / "data", work_dir=tmp_path / "work", device="cpu", checksums=checksums)

    chain = voc_chain(tmp_path / "MD5SUMS")
    assert shlex.join(chain.stages[0].commands[0][1:]) == (
        f"tools/prepare_data.py voc {tmp_path / 'data'} --checksums {tmp_path / 'MD5SUMS'}")  # fmt: skip
    run_chain(chain, Recorder(chain))
    for other in (voc_chain(tmp_path / "OTHER"), voc_chain(None)):
        assert statuses(run_chain(other, Recorder(other))) == ["skipped"] * 5
    assert reproduce_cli.main(["toy", "--checksums", str(tmp_path / "MD5SUMS")]) == 2
    assert capsys.readouterr().err == "error: --checksums applies to the voc chain only\n"


def cli_args(tmp_path: Path) -> list[str]:
    """``tools/reproduce.py toy`` on the tiny model, into ``tmp_path``."""
    return ["toy", "--data-root", str(tmp_path / "data"), "--work-dir", str(tmp_path / "work"), "--num-train", "4",
            "--num-val", "2", "--device", "cpu", "--cfg-options", *TINY]  # fmt: skip


def fail_writes(monkeypatch: pytest.MonkeyPatch, code: int, after: int = 0) -> None:
    """Every write of the record after the first ``after`` fails with OSError ``code``, chained to a first one as a
    full disk's fails again when the file is closed."""
    real, calls = reproduce.atomic_write_text, []

    def write(path, text):
        calls.append(path)
        if len(calls) <= after:
            return real(path, text)
        try:
            raise OSError(code, os.strerror(code), str(path))
        except OSError:
            raise OSError(code, os.strerror(code)) from None

    monkeypatch.setattr(reproduce, "atomic_write_text", write)


def test_a_read_only_work_dir_is_refused_in_one_line_before_any_stage(tmp_path, capsys, monkeypatch):
    fail_writes(monkeypatch, errno.EROFS)
    ran = []
    monkeypatch.setattr(reproduce, "run_command", lambda command, log, echo=True: ran.append(command) or 0)
    assert reproduce_cli.main(cli_args(tmp_path)) == 1
    err = capsys.readouterr().err
    record = tmp_path / "work" / "reproduce.json"
    assert err == (f"error: cannot write the chain's record {record} (Read-only file system): free space on its disk, "
                   "or give --work-dir a folder you can write to; then run the same command again (the finished "
                   "stages are skipped)\n")  # fmt: skip
    assert ran == []


def test_a_full_disk_after_a_stage_is_one_line(tmp_path, capsys, monkeypatch):
    """The disk fills during a stage: the stage fails, then the record cannot be written (a chained OSError 28)."""
    fail_writes(monkeypatch, errno.ENOSPC, after=1)
    monkeypatch.setattr(reproduce, "run_command", lambda command, log, echo=True: 1)
    assert reproduce_cli.main(cli_args(tmp_path)) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: cannot write the chain's record ") and err.count("\n") == 1, err
    assert f"{tmp_path / 'work' / 'reproduce.json'} (No space left on device): free space on its disk" in err


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (lambda stages: stages.update(train="done"), "stage 'train': a str, not a mapping"),
        (lambda stages: stages["train"].update(seconds="slow"), "stage 'train': 'seconds' is 'slow', not a number"),
        (lambda stages: stages["train"].pop("seconds"), "stage 'train': 'seconds' is None, not a number"),
        (lambda stages: stages["report"].update(settings=5), "stage 'report': 'settings' is 5, not a list of"),
        (lambda stages: stages["test --tta --crf"].update(settings=[1]), "'settings' is [1], not a list of argument"),
    ],
)
def test_a_record_whose_stage_entries_have_the_wrong_type_is_named_with_the_fix(tmp_path, capsys, edit, says):
    chain = toy_chain(tmp_path)
    run_chain(chain, Recorder(chain))
    record = json.loads(chain.record.read_text())
    edit(record["stages"])
    chain.record.write_text(json.dumps(record))
    again = Recorder(chain)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(chain.record))} is not the chain's record \(.*delete it"):
        run_chain(chain, again)
    assert again.calls == []
    capsys.readouterr()
    assert reproduce_cli.main(cli_args(tmp_path)) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {chain.record} is not the chain's record (") and err.count("\n") == 1, err
    assert says in err and err.endswith("delete it to run every stage again\n")


def test_ctrl_c_prints_where_the_chain_stopped_without_a_traceback(tmp_path, capsys, monkeypatch):
    def interrupted(command, log, echo=True):
        raise KeyboardInterrupt

    monkeypatch.setattr(reproduce, "run_command", interrupted)
    try:
        status = reproduce_cli.main(cli_args(tmp_path))
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C left tools/reproduce.py as a traceback")
    assert status == reproduce_cli.INTERRUPTED == 130
    captured = capsys.readouterr()
    record = tmp_path / "work" / "reproduce.json"
    assert captured.out.splitlines()[-1] == (f"interrupted during [1/5] prepare; run the same command again to resume "
                                             f"(record: {record})")  # fmt: skip
    assert captured.err == ""


def test_the_record_drops_the_later_stages_before_a_stage_runs(tmp_path):
    """A SIGKILL during a stage leaves the record as it was when the stage started: without the stage and those after
    it, so the next run reruns them rather than skipping them on their old outputs."""
    chain = toy_chain(tmp_path)
    run_chain(chain, Recorder(chain))
    chain.stages[2].outputs[0].unlink()  # the test stage runs again
    on_disk = {}

    def snapshot(command, log):
        on_disk.setdefault(Path(command[1]).stem, list(json.loads(chain.record.read_text())["stages"]))
        return Recorder(chain)(command, log)

    run_chain(chain, Recorder(chain, run=snapshot))
    assert on_disk == {"test": NAMES[:2], "eval_cams": NAMES[:3], "report": NAMES[:4]}


def test_an_interrupted_run_command_stops_the_stages_process(tmp_path):
    """Ctrl-C or SIGTERM reaching the chain (not the stage: a stage started elsewhere, or one that ignores SIGINT)
    while a stage runs: the stage's process is ended, not left running on its own."""
    pid_file = tmp_path / "pid"
    code = ("import os, signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
            f"open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)")  # fmt: skip
    main = threading.main_thread().ident

    def interrupt_when_started():
        deadline = time.monotonic() + 30
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        signal.pthread_kill(main, signal.SIGINT)

    threading.Thread(target=interrupt_when_started, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        run_command([sys.executable, "-c", code], tmp_path / "x.log", echo=False)
    pid = int(pid_file.read_text())
    try:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # ended and reaped
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
