"""``make reproduce``: from nothing to the paper's tables in one command, each stage resumable (``tools/reproduce.py``).

The stages, in order, each the tool's own command line run as its own process:

1. prepare: ``tools/prepare_data.py voc ROOT`` (VOC 2012 + SBD, checksums checked; ``--archives``, ``--mirror``,
   ``--checksums`` passed on), or for the toy set ``tools/make_toy_voc.py`` and ``tools/make_cls_labels.py``, as
   ``make demo``;
2. train: ``tools/train.py CONFIG --resume``: a run that was interrupted continues from its newest checkpoint;
3. test: ``tools/test.py CONFIG CKPT --tta --crf`` on the val split (multi-scale + flip + dense CRF; Tables 1-2);
4. pseudo labels: ``tools/eval_cams.py CKPT --split train --pseudo`` (Table 3: the pseudo labels of the training
   set, as the paper and ToCo score them; on VOC its ``train`` split, 1464 images with masks);
5. report: ``tools/report.py WORK_DIR`` (``report.md``, ``report.json``).

``WORK_DIR/reproduce.json`` (written atomically) records each finished stage: its commands, its outputs, its seconds.
A stage counts as finished while the record holds it with the same settings and its outputs exist; a re-run skips
it. Once a stage runs, every later stage runs after it, since its input changed. Each stage's output goes to the
console and to ``WORK_DIR/reproduce_logs/<n>_<stage>.log``.
"""

from __future__ import annotations

import codecs
import json
import os
import reprlib
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wsss.config import fits_float, load_config, parse_cfg_options
from wsss.data.prepare.pipeline import DATASETS
from wsss.evaluation.protocol import run_dir_name
from wsss.utils.fileio import atomic_write_text

REPO = Path(__file__).resolve().parents[1]
RECORD = "reproduce.json"
LOG_DIR = "reproduce_logs"
CONFIGS = {"voc": "configs/voc_centered.py", "toy": "configs/toy_centered.py"}
"""The config each dataset trains (the paper's, and the CPU demo's)."""
TOY_FOLDER = "toy_voc"
"""The toy set's folder under ROOT (``data/toy_voc``, where ``configs/toy_centered.py`` reads it)."""
PSEUDO_SPLIT = "train"
"""The split whose pseudo labels are scored (the paper's Table 3: "pseudo labels produced on the training set")."""
UNKEYED_OPTIONS = ("--archives", "--mirror", "--checksums", "--device")
"""Options that choose where inputs come from or where a tool runs, not what it makes: changing them leaves a
finished stage finished."""
SCHEDULE_KEY = "train.max_iters"
"""The one training setting a finished run may change and resume with: its schedule's length."""
TERMINATE_WAIT_S = 30.0
"""Seconds a stage's process has to exit after SIGTERM (the chain was interrupted) before it is killed."""

Runner = Callable[[Sequence[str], Path], int]
"""Runs one command, appending its output to the log file; returns its exit status."""

__all__ = ["Chain", "ChainResult", "Stage", "plan_chain", "run_chain", "run_command"]


@dataclass(frozen=True)
class Stage:
    """One stage of the chain: the commands it runs, in order, and the files that exist once it has finished."""

    name: str
    commands: tuple[tuple[str, ...], ...]
    outputs: tuple[Path, ...]
    resumes: bool = False
    """Its command continues what an earlier run left (training's ``--resume``) rather than making it anew: finished
    with other settings (but a longer :data:`SCHEDULE_KEY`), it is refused, since running it again would keep the
    earlier run's results."""

    def settings(self) -> list[list[str]]:
        """What decides the outputs: each command without the interpreter and the :data:`UNKEYED_OPTIONS`."""
        kept = []
        for command in self.commands:
            args, skip = [], False
            for arg in command[1:]:
                if not skip and arg not in UNKEYED_OPTIONS:
                    args.append(arg)
                skip = not skip and arg in UNKEYED_OPTIONS
            kept.append(args)
        return kept


@dataclass(frozen=True)
class Chain:
    """The stages of one dataset's chain and the work dir that holds its record, logs and results."""

    stages: tuple[Stage, ...]
    work_dir: Path

    @property
    def record(self) -> Path:
        return self.work_dir / RECORD

    def log(self, index: int) -> Path:
        """The log of stage ``index`` (1-based)."""
        return self.work_dir / LOG_DIR / f"{index}_{self.stages[index - 1].name.split()[0]}.log"


@dataclass
class ChainResult:
    """What one run of the chain did: per stage its status (ran, skipped, failed, interrupted, not run) and seconds
    (this run's; for a skipped stage, those of the run that finished it), the run's own seconds, and the error line."""

    stages: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    error: str | None = None

    @property
    def returncode(self) -> int:
        return 0 if self.error is None else 1

    def table(self) -> str:
        """The stage times as a fixed-width table."""
        names = [f"[{i}/{len(self.stages)}] {s['stage']}" for i, s in enumerate(self.stages, 1)]
        width = max(len(name) for name in names) + 2
        lines = [f"{'stage':<{width}}{'this run':<12}{'seconds':>9}"]
        for name, s in zip(names, self.stages, strict=True):
            seconds = "-" if s["seconds"] is None else f"{s['seconds']:.1f}"
            lines.append(f"{name:<{width}}{s['status']:<12}{seconds:>9}")
        lines.append(f"{'total, this run':<{width + 12}}{self.seconds:>9.1f}")
        return "\n".join(lines)


def plan_chain(
    dataset: str,
    data_root: str | Path = "data",
    *,
    work_dir: str | Path | None = None,
    config: str | Path | None = None,
    cfg_options: Sequence[str] = (),
    device: str | None = None,
    archives: str | Path | None = None,
    mirror: str | None = None,
    checksums: str | Path | None = None,
    num_train: int | None = None,
    num_val: int | None = None,
) -> Chain:
    """The chain for ``dataset``: its five stages' commands and outputs.

    Args:
        dataset: ``voc`` (the paper: VOC 2012 + SBD, ``configs/voc_centered.py``) or ``toy`` (the generated set,
            ``configs/toy_centered.py``).
        data_root: ROOT of ``tools/prepare_data.py`` (the dataset lands in ``ROOT/VOCdevkit/VOC2012``), or the
            folder the toy set goes in (``ROOT/toy_voc``); training and evaluation read the dataset there.
        work_dir: Where the checkpoints, test runs, report and the chain's record go (default: the config's).
        config: The config to train (default: the dataset's, :data:`CONFIGS`).
        cfg_options: ``key=value`` overrides for training and test, as ``--cfg-options`` takes them.
        device: ``cuda`` or ``cpu`` for training and evaluation (default: CUDA when available).
        archives: VOC only: the folder of archives the user already has (``tools/prepare_data.py --archives``).
        mirror: VOC only: a mirror's address (``--mirror``).
        checksums: VOC only: an md5sum-format file of the MD5s to check instead of the published ones
            (``--checksums``, for a mirror's or a lab's own copies).
        num_train: Toy only: images of the train split (``tools/make_toy_voc.py --num-train``).
        num_val: Toy only: images of the val split (``--num-val``).

    Raises:
        ValueError: An option of the other dataset, or ``data.root`` among ``cfg_options`` (the chain sets it).
        wsss.config.ConfigError: The config or an override is invalid.
    """
    if dataset not in CONFIGS:
        raise ValueError(f"unknown dataset {dataset!r}; choose one of {sorted(CONFIGS)}")
    toy_only = [name for name, v in (("--num-train", num_train), ("--num-val", num_val)) if v is not None]
    voc_only = [name for name, v in (("--archives", archives), ("--mirror", mirror), ("--checksums", checksums))
                if v is not None]  # fmt: skip
    if wrong := (voc_only if dataset == "toy" else toy_only):
        raise ValueError(f"{', '.join(wrong)} applies to the {'voc' if dataset == 'toy' else 'toy'} chain only")
    if given := [o for o in cfg_options if o.split("=", 1)[0] == "data.root"]:
        raise ValueError(f"--cfg-options {given[0]}: the chain reads the dataset where it prepares it; give "
                         "--data-root ROOT instead")  # fmt: skip
    data_root = Path(data_root)
    if dataset == "voc":
        dataset_root = data_root / DATASETS["voc"].data["root"]
    else:
        dataset_root = data_root / TOY_FOLDER
    config = _shown(Path(config) if config else REPO / CONFIGS[dataset])
    options = [f"data.root={dataset_root}", *cfg_options]
    cfg = load_config(config, parse_cfg_options(options))
    work = Path(work_dir or cfg.work_dir or Path("work_dirs") / Path(config).stem)
    device = device or _default_device()
    data = cfg.data
    splits = dict.fromkeys((data.train_split, data.val_split, PSEUDO_SPLIT))
    split_files = (dataset_root / "ImageSets" / "Segmentation" / f"{s}.txt" for s in splits)
    ready = (dataset_root / data.label_file, *split_files)
    if dataset == "voc":
        sources = [*(["--archives", str(archives)] if archives else []), *(["--mirror", mirror] if mirror else []),
                   *(["--checksums", str(checksums)] if checksums else [])]  # fmt: skip
        prepare = (_tool("prepare_data", "voc", data_root, *sources),)
    else:
        sizes = [*(["--num-train", num_train] if num_train else []), *(["--num-val", num_val] if num_val else [])]
        prepare = (_tool("make_toy_voc", dataset_root, *sizes),
                   _tool("make_cls_labels", dataset_root, "--classes", dataset_root / str(data.classes),
                         "--mask-dir", data.mask_dir))  # fmt: skip
    ckpt = work / f"iter_{cfg.train.max_iters}.pth"
    cams = work / f"cam_eval_{ckpt.stem}_{PSEUDO_SPLIT}"
    on_device = ("--device", device)
    train = _tool("train", config, "--work-dir", work, "--resume", *on_device, "--cfg-options", *options)
    test = _tool("test", config, ckpt, "--work-dir", work, "--tta", "--crf", *on_device, "--cfg-options", *options)
    pseudo = _tool("eval_cams", ckpt, "--split", PSEUDO_SPLIT, "--pseudo", "--out", cams, "--data-root", dataset_root,
                   *on_device)  # fmt: skip
    stages = (
        Stage("prepare", prepare, ready),
        Stage("train", (train,), (ckpt,), resumes=True),
        Stage("test --tta --crf", (test,), (work / run_dir_name(ckpt, None, tta=True, crf=True) / "metrics.json",)),
        Stage("eval_cams --pseudo", (pseudo,), (cams / "cam_eval.json",)),
        Stage("report", (_tool("report", work),), (work / "report.md", work / "report.json")),
    )
    return Chain(stages, work)


def run_chain(chain: Chain, runner: Runner | None = None, out: Callable[[str], None] = print) -> ChainResult:
    """Run the stages of ``chain`` that are not finished, in order, and record the finished ones.

    Prints each stage's start (with its commands and log) and its seconds when done, ``skipped`` for a finished
    one, and at the end the table of stage times; the first stage that fails stops the chain with one error line
    (the stage, the command to rerun, its log), printed last. ``WORK_DIR/reproduce.json`` holds the finished
    stages and, under ``last_run``, the run's stage times.

    Args:
        chain: What :func:`plan_chain` made.
        runner: Runs one command (default :func:`run_command`, the console echoing its output).
        out: Receives each printed line.

    Raises:
        ValueError: The record exists but is not the chain's JSON, or a stage's entry is not what the chain writes
            (the message names it and the fix).
        OSError: The record cannot be written (a read-only work dir, a full disk): one line naming it and the fix.
        KeyboardInterrupt, SystemExit: The chain was interrupted; the stage running is recorded as interrupted.
    """
    runner = runner or run_command
    record = _read_record(chain.record)
    done = record.setdefault("stages", {})
    earlier = dict(done)  # as the last run left it: a stage that runs drops the later ones' entries
    result, started, n = ChainResult(), time.perf_counter(), len(chain.stages)
    result.stages = [{"stage": s.name, "status": "not run", "seconds": None} for s in chain.stages]
    run_all, label = False, ""  # once a stage runs, every later one runs after it
    try:
        for i, stage in enumerate(chain.stages, 1):
            label, entry, row = f"[{i}/{n}] {stage.name}", done.get(stage.name), result.stages[i - 1]
            if not run_all and _finished(entry, stage):
                out(f"{label}: finished before, skipped")
                row.update(status="skipped", seconds=entry["seconds"])
                continue
            before = earlier.get(stage.name)
            if stage.resumes and before is not None and _unscheduled(before.get("settings")) != _unscheduled(
                stage.settings()
            ):
                result.error = (f"error: {label}: {chain.work_dir} holds a run finished with other settings (recorded "
                                f"in {chain.record}), which training there would only resume; give --work-dir for a "
                                f"new run, or delete {chain.work_dir} to train anew")  # fmt: skip
                break
            run_all = True
            for later in chain.stages[i - 1 :]:
                done.pop(later.name, None)
            _write_record(chain.record, record, result, started)
            log = chain.log(i)
            out(f"{label} ... (log: {log})")
            row["status"], tic = "interrupted", time.perf_counter()
            for command in stage.commands:
                out(f"$ {shlex.join(command)}")
                result.error = _failure(label, command, log, runner)
                if result.error is not None:
                    break
            missing = [str(p) for p in stage.outputs if not p.exists()]
            if result.error is None and missing:
                result.error = (f"error: {label} exited 0 but did not write {', '.join(missing)}; rerun it with: "
                                f"{shlex.join(stage.commands[-1])} (log: {log})")  # fmt: skip
            row.update(status="failed" if result.error else "ran", seconds=time.perf_counter() - tic)
            if result.error is not None:
                break
            out(f"{label}: {row['seconds']:.1f} s")
            done[stage.name] = {
                "index": i, "commands": [list(c) for c in stage.commands], "settings": stage.settings(),
                "outputs": [str(p) for p in stage.outputs], "log": str(log), "seconds": round(row["seconds"], 2),
                "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            }  # fmt: skip
    except (KeyboardInterrupt, SystemExit):
        result.seconds = time.perf_counter() - started
        _write_record(chain.record, record, result, started)
        out(f"interrupted during {label}; run the same command again to resume (record: {chain.record})")
        raise
    result.seconds = time.perf_counter() - started
    _write_record(chain.record, record, result, started)
    out(result.table())
    if result.error is None:
        out(f"report: {chain.work_dir / 'report.md'}; stage times in {chain.record}")
    else:
        out(result.error)
    return result


def run_command(command: Sequence[str], log: Path, echo: bool = True) -> int:
    """Run ``command``, appending its output (stdout and stderr) to ``log`` and, with ``echo``, to the console.

    A chain interrupted while it runs (Ctrl-C, SIGTERM) stops the process: SIGTERM, then SIGKILL after
    :data:`TERMINATE_WAIT_S`.

    Returns:
        The exit status.
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as sink:
        sink.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} $ {shlex.join(command)}\n".encode())
        sink.flush()
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
        decoder, last = codecs.getincrementaldecoder("utf-8")(errors="replace"), b"\n"
        try:
            while chunk := os.read(proc.stdout.fileno(), 1 << 16):
                sink.write(chunk)
                sink.flush()
                if echo:
                    sys.stdout.write(decoder.decode(chunk))
                    sys.stdout.flush()
                last = chunk[-1:]
            return proc.wait()
        finally:
            if echo and last != b"\n":  # after a progress bar's last line, the chain's next line starts on its own
                sys.stdout.write("\n")
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(TERMINATE_WAIT_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            proc.stdout.close()


def _failure(label: str, command: tuple[str, ...], log: Path, runner: Runner) -> str | None:
    """Run one command of a stage; the error line if it failed, else None."""
    try:
        status = runner(command, log)
    except OSError as err:  # the interpreter or the log cannot be opened
        return f"error: {label} could not run ({err}); rerun it with: {shlex.join(command)} (log: {log})"
    if status == 0:
        return None
    return f"error: {label} failed (exit {status}); rerun it with: {shlex.join(command)} (log: {log})"


def _finished(entry: dict[str, Any] | None, stage: Stage) -> bool:
    return entry is not None and entry.get("settings") == stage.settings() and all(p.exists() for p in stage.outputs)


def _unscheduled(settings: Any) -> Any:
    """A stage's settings without ``train.max_iters``: a longer schedule continues a finished training
    (``--resume``), which no other change of its settings does."""
    if not isinstance(settings, list):
        return settings
    return [[a for a in args if not str(a).startswith(f"{SCHEDULE_KEY}=")] for args in settings]


def _read_record(path: Path) -> dict[str, Any]:
    """The record at ``path`` ({} when there is none), each stage's entry checked to hold what the chain reads."""
    if not path.is_file():
        return {}
    try:
        record = json.loads(path.read_text())
    except (ValueError, RecursionError) as err:
        raise ValueError(f"{path} is not the chain's record ({err}); delete it to run every stage again") from None
    if not isinstance(record, dict) or not isinstance(record.get("stages", {}), dict):
        raise ValueError(f"{path} is not the chain's record (no 'stages' mapping); delete it to run every stage again")
    for name, entry in record.get("stages", {}).items():
        if problem := _entry_problem(entry):
            raise ValueError(f"{path} is not the chain's record (stage {name!r}: {problem}); delete it to run every "
                             "stage again")  # fmt: skip
    return record


def _entry_problem(entry: Any) -> str | None:
    """Why a stage's entry of the record is not one :func:`run_chain` wrote, else None: it reads its ``settings`` (a
    list of argument lists) and ``seconds`` (a number)."""
    if not isinstance(entry, dict):
        return f"a {type(entry).__name__}, not a mapping"
    settings, seconds = entry.get("settings"), entry.get("seconds")
    if not isinstance(settings, list) or not all(isinstance(args, list) for args in settings):
        return f"'settings' is {reprlib.repr(settings)}, not a list of argument lists"
    if not fits_float(seconds):
        return f"'seconds' is {reprlib.repr(seconds)}, not a number"
    return None


def _write_record(path: Path, record: dict[str, Any], result: ChainResult, started: float) -> None:
    """Write the record with this run's stage times.

    Raises:
        OSError: It cannot be written: one line naming it and the fix.
    """
    record["last_run"] = {"seconds": round(time.perf_counter() - started, 2),
                          "stages": [{**s, "seconds": None if s["seconds"] is None else round(s["seconds"], 2)}
                                     for s in result.stages]}  # fmt: skip
    try:
        atomic_write_text(path, json.dumps(record, indent=2) + "\n")
    except OSError as err:
        raise OSError(f"cannot write the chain's record {path} ({err.strerror or err}): free space on its disk, or "
                      "give --work-dir a folder you can write to; then run the same command again (the finished "
                      "stages are skipped)") from None  # fmt: skip


def _tool(name: str, *args: Any) -> tuple[str, ...]:
    """``python tools/<name>.py ARGS`` with this interpreter."""
    return (sys.executable, _shown(REPO / "tools" / f"{name}.py"), *(str(a) for a in args))


def _shown(path: Path) -> str:
    """``path`` relative to the current folder when inside it (``tools/train.py`` from the repository), else as is."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
