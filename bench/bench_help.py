"""Wall time of ``python tools/X.py --help`` for every tool, against ``python -c "import torch"`` in the same run.

    python bench/bench_help.py [--runs 7] [--before REV] [--tools train.py infer.py ...]

Every command runs ``--runs`` times (after ``--warmup`` uncounted rounds that fill the page cache), one fresh
subprocess per run, in rounds that run each command once in a shuffled order, so that load drifting on a shared
machine touches every command alike. Reported: the median wall seconds of each command and its ratio to
``import torch``, the median over rounds of (tool time / ``import torch`` time of the same round). The peers
``python -c pass`` (interpreter start-up, the floor) and ``python -c "import torch"`` get their rows too.

``--before REV`` also times the tools as they are at git revision REV (e.g. ``HEAD``, a commit before a change):
``git archive REV`` is unpacked into a temporary folder, removed afterwards, and each tree's tools run with
PYTHONPATH set to that tree, so they import its ``wsss`` package (checked), with the same Python
(``sys.executable``, this venv). The table then has before and after columns; the after columns are this
working tree as it is now. The table is markdown, for docs/benchmarks.md; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import random
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PEERS = {"`python -c pass`": ["-c", "pass"], '`python -c "import torch"`': ["-c", "import torch"]}
TORCH = '`python -c "import torch"`'


def git(*args: str) -> str:
    """Output of a read-only git command in this repository."""
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def unpack_revision(rev: str, dest: Path) -> str:
    """Write the tracked files of ``rev`` into ``dest`` (no worktree, no change to the repository); its short hash."""
    commit = git("rev-parse", "--short", f"{rev}^{{commit}}")
    archive = subprocess.run(["git", "archive", "--format=tar", commit], cwd=ROOT, capture_output=True, check=True)
    tar_path = dest.with_suffix(".tar")
    tar_path.write_bytes(archive.stdout)
    with tarfile.open(tar_path) as tar:
        tar.extractall(dest, filter="data")
    tar_path.unlink()
    return commit


def tree_env(root: Path) -> dict[str, str]:
    """The environment in which ``root``'s tools import ``root``'s ``wsss`` package (checked)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    probe = [sys.executable, "-c", "import wsss; print(wsss.__file__)"]
    found = Path(subprocess.run(probe, cwd=root, env=env, capture_output=True, text=True, check=True).stdout.strip())
    if not found.resolve().is_relative_to(root.resolve()):
        raise RuntimeError(f"in {root}, wsss is imported from {found}, not from the tree under test")
    return env


def timed(cmd: list[str], cwd: Path, env: dict[str, str]) -> float:
    """Wall seconds of one run of ``cmd``; a failing command stops the benchmark with its error."""
    start = time.perf_counter()
    run = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - start
    if run.returncode:
        raise RuntimeError(f"{' '.join(cmd[1:])} in {cwd} exited {run.returncode}: {run.stderr.strip()[-500:]}")
    return seconds


def measure(jobs: dict[tuple[str, str], tuple[list[str], Path, dict]], runs: int, warmup: int, seed: int) -> dict:
    """``{(column, row): [seconds per counted round]}`` for ``jobs`` ``{(column, row): (cmd, cwd, env)}``."""
    times: dict[tuple[str, str], list[float]] = {key: [] for key in jobs}
    order = list(jobs)
    rng = random.Random(seed)
    for round_index in range(warmup + runs):
        rng.shuffle(order)
        tic = time.perf_counter()
        for key in order:
            seconds = timed(*jobs[key])
            if round_index >= warmup:
                times[key].append(seconds)
        label = "warm-up" if round_index < warmup else f"round {round_index - warmup + 1}/{runs}"
        print(f"{label}: {len(order)} commands in {time.perf_counter() - tic:.1f} s", file=sys.stderr)
    return times


def cells(times: dict, column: str, row: str) -> list[str]:
    """Median seconds and median paired ratio to ``import torch`` of one command, or dashes when it is absent."""
    if (column, row) not in times:
        return ["—", "—"]
    own, torch_times = times[column, row], times["peer", TORCH]
    ratio = statistics.median(a / b for a, b in zip(own, torch_times, strict=True))
    return [f"{statistics.median(own):.2f}", f"{ratio:.2f}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7, help="counted runs of every command (median reported)")
    parser.add_argument("--warmup", type=int, default=1, help="uncounted rounds first")
    parser.add_argument("--before", metavar="REV", help="also time the tools of this git revision")
    parser.add_argument("--tools", nargs="+", metavar="NAME.py", help="only these tools (default: every tools/*.py)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the order of the commands within a round")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench_help_") as tmp:
        trees = {"after": ROOT}
        after_label = git("rev-parse", "--short", "HEAD") + (" + working tree" if git("status", "--porcelain") else "")
        labels = {"after": after_label}
        if args.before:
            trees["before"] = Path(tmp) / "before"
            labels["before"] = unpack_revision(args.before, trees["before"])
        columns = [c for c in ("before", "after") if c in trees]
        jobs = {("peer", name): ([sys.executable, *argv], ROOT, dict(os.environ)) for name, argv in PEERS.items()}
        rows = set()
        for column in columns:
            env = tree_env(trees[column])
            for path in sorted((trees[column] / "tools").glob("*.py")):
                if path.name != "__init__.py" and (args.tools is None or path.name in args.tools):
                    jobs[column, path.name] = ([sys.executable, f"tools/{path.name}", "--help"], trees[column], env)
                    rows.add(path.name)
        load_start = os.getloadavg()
        times = measure(jobs, args.runs, args.warmup, args.seed)
        load_end = os.getloadavg()

    print(f"`python bench/bench_help.py {' '.join(sys.argv[1:])}`, {datetime.date.today()}, {platform.node()}: "
          f"{os.cpu_count()} CPUs, load average {load_start[0]:.2f} at the start and {load_end[0]:.2f} at the end, "
          f"Python {platform.python_version()}; {args.runs} runs per command after {args.warmup} warm-up round(s); "
          "median wall seconds; ratio: median over rounds of time / import torch time.\n")  # fmt: skip
    print(format_table(times, columns, labels, sorted(rows)))


def format_table(times: dict, columns: list[str], labels: dict[str, str], tools: list[str]) -> str:
    """The markdown table: the peers, then one row per tool; two cells (seconds, ratio) per column."""
    header = ["command"] + [h for c in columns for h in (f"{c}: {labels[c]} (s)", f"{c} / import torch")]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" + "---:|" * (len(header) - 1)]
    for name in PEERS:
        lines.append("| " + " | ".join([name] + cells(times, "peer", name) * len(columns)) + " |")
    for tool in tools:
        values = [value for column in columns for value in cells(times, column, tool)]
        lines.append("| " + " | ".join([f"`tools/{tool} --help`", *values]) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
