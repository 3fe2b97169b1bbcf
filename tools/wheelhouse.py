"""Download (and build where only a source archive exists) a wheel of every requirement except torch,
torchvision, triton and the CUDA libraries they bring, for a machine without internet that has those already.

    python3.12 tools/wheelhouse.py wheelhouse          # on a machine with internet (make wheelhouse)
    make install-offline WHEELHOUSE=wheelhouse         # on the machine without: pip --no-index from the folder

The wheels are for the Python running this script and for this platform (run it with the target's Python version,
on Linux x86-64 for a Linux x86-64 cluster). It resolves requirements.txt + requirements-dev.txt for that Python
(metadata only: torch itself is never downloaded), then fetches each package of the result, torch's pure-Python
needs included. The folder appears only when complete (it is built under DEST.partial, which a rerun reuses).
Standard library only: it runs before anything else is installed.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REQUIREMENT_FILES = ("requirements.txt", "requirements-dev.txt")
# Installed with the GPU stack on the target, never from the folder: torch, torchvision, triton and their CUDA wheels.
PREINSTALLED = re.compile(r"^(torch|torchvision|triton|nvidia-.*|cuda-.*)$")


def normalize(name: str) -> str:
    """A distribution name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(line: str) -> str:
    """The distribution name at the start of a requirement line."""
    return normalize(re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", line).group(0))


def offline_requirements(root: Path = ROOT) -> list[str]:
    """The lines of the requirement files, comments and the preinstalled packages left out."""
    lines = []
    for name in REQUIREMENT_FILES:
        for line in (root / name).read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line and not PREINSTALLED.match(requirement_name(line)):
                lines.append(line)
    return lines


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True)


def resolve(requirements: Path, report: Path) -> list[str]:
    """``name==version`` of every package pip would install for ``requirements`` on an empty environment of this
    Python, the preinstalled ones left out."""
    pip("install", "--quiet", "--dry-run", "--ignore-installed", "--report", str(report), "-r", str(requirements))
    installs = json.loads(report.read_text())["install"]
    pins = [(normalize(i["metadata"]["name"]), i["metadata"]["version"]) for i in installs]
    return sorted(f"{name}=={version}" for name, version in pins if not PREINSTALLED.match(name))


def build(dest: Path) -> Path:
    """Fill ``dest`` (via ``dest.partial``) with the wheels; returns ``dest``."""
    if dest.exists():
        raise FileExistsError(f"{dest} exists: delete it or name another folder")
    partial = dest.with_name(dest.name + ".partial")
    partial.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        wanted, lock = Path(tmp) / "requirements.txt", Path(tmp) / "lock.txt"
        wanted.write_text("\n".join(offline_requirements()) + "\n")
        lock.write_text("\n".join(resolve(wanted, Path(tmp) / "report.json")) + "\n")
        pip("wheel", "--quiet", "--no-deps", "--wheel-dir", str(partial), "-r", str(lock))
    partial.rename(dest)
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dest", type=Path, help="the folder to create")
    args = parser.parse_args(argv)
    try:
        dest = build(args.dest)
    except (FileExistsError, subprocess.CalledProcessError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    wheels = sorted(dest.glob("*.whl"))
    size = sum(w.stat().st_size for w in wheels) / 2**20
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    print(f"{len(wheels)} wheels ({size:.0f} MiB) for Python {version} in {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
