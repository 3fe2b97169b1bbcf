"""The README's commands stay current: every ``tools/X.py`` it shows exists, every ``--flag`` it gives one is in
that tool's ``--help``, and every ``configs/*.py`` it names is shipped."""

from __future__ import annotations

import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
CODE_BLOCK = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`([^`\n]+)`")
TOOL_CALL = re.compile(r"(?<![\w/])tools/(\w+)\.py\b(.*)")
FLAG = re.compile(r"(?<![\w-])(--[a-z][\w-]*)")
CONFIG = re.compile(r"(?<![\w/])(configs/\w+\.py)\b")


def readme_commands(text: str) -> list[str]:
    """Every command line of the README's shell code blocks and inline code spans that runs a ``tools/`` script,
    continuation lines joined and comments dropped."""
    text = CODE_BLOCK.sub(lambda m: "" if m.group(0).startswith("```python") else m.group(0), text)
    lines = []
    for block in CODE_BLOCK.findall(text):
        lines += block.replace("\\\n", " ").splitlines()
    lines += CODE_SPAN.findall(CODE_BLOCK.sub("", text))
    commands = (line.split(" #")[0].strip() for line in lines)
    return [command for command in commands if TOOL_CALL.search(command)]


def tool_flags(command: str) -> tuple[str, list[str]]:
    """The tool a command runs and the flags it gives that tool."""
    name, rest = TOOL_CALL.search(command).groups()
    return name, FLAG.findall(rest)


@cache
def help_text(tool: str) -> str:
    run = subprocess.run([sys.executable, f"tools/{tool}.py", "--help"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert run.returncode == 0, run.stderr
    return run.stdout


COMMANDS = readme_commands(README.read_text())


def test_the_readme_commands_are_found():  # the tests below would pass on an empty list
    assert len(COMMANDS) >= 30
    name, flags = tool_flags("torchrun --nproc-per-node 8 tools/test.py CFG CKPT --tta --launcher pytorch  ")
    assert (name, flags) == ("test", ["--tta", "--launcher"])
    assert readme_commands("```\npython tools/a.py X \\\n    --b  # c --d\n```\n") == ["python tools/a.py X      --b"]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_readme_command_uses_flags_its_tool_has(command):
    name, flags = tool_flags(command)
    assert (ROOT / "tools" / f"{name}.py").is_file(), f"README runs tools/{name}.py, which does not exist"
    usage = help_text(name)
    missing = [flag for flag in flags if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", usage)]
    assert not missing, f"README: `{command.strip()}` gives tools/{name}.py {missing}, not in its --help"
    for config in CONFIG.findall(command):
        assert (ROOT / config).is_file(), f"README: `{command.strip()}` names {config}, which is not shipped"


OUTPUT_FOLDERS = ("out", "submit")
"""The folders the README's commands write beside data/ and work_dirs/ (tools/infer.py's and make_pseudo_labels.py's
OUT, tools/test.py's --out)."""


def test_what_the_readme_commands_write_is_ignored_by_git():
    """After the demo's commands ``git status`` showed ``?? out/`` (issue 38, section 5.5)."""
    if subprocess.run(["git", "rev-parse"], cwd=ROOT, capture_output=True).returncode != 0:
        pytest.skip("not a git checkout")
    written = sorted({path for command in COMMANDS for path in re.findall(
        rf"(?<![\w/.$-])((?:{'|'.join(OUTPUT_FOLDERS)})/[\w./-]*)", command)})  # fmt: skip
    assert {"out/toy", "out/toy_pseudo", "submit/"} <= set(written)  # the demo's, and the test server's archive
    run = subprocess.run(["git", "check-ignore", "--no-index", "--verbose", "--non-matching", *written], cwd=ROOT,
                         capture_output=True, text=True)  # fmt: skip
    tracked = [line.split("\t")[1] for line in run.stdout.splitlines() if line.startswith("::")]
    assert tracked == [], f"README commands write {tracked}, which .gitignore does not cover"


def test_the_demo_has_one_timing_with_its_machine_and_load():
    """The demo paragraph said 2 min 19 s and then 270 s for the same run (issue 38, section 5.4): one figure, with the
    machine's cores and its load average, since the time depends on both."""
    section = README.read_text().split("## Two commands", 1)[1].split("\n## ", 1)[0]
    demo = " ".join(next(p for p in section.split("\n\n") if "tools/train.py configs/toy_centered.py" in p).split())
    timings = re.findall(r"\b\d+ min \d+ s\b|\b\d+(?:\.\d+)? s\b", demo)
    assert len(timings) == 1, f"the demo paragraph gives {timings}"
    assert re.search(r"\d-core", demo) and re.search(r"load average [\d.]+ at the start, [\d.]+ at the end", demo)
