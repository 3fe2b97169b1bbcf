"""The package's shape: no import cycles, no function-local imports of wsss, models independent of the config."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

WSSS = Path(__file__).resolve().parents[1] / "wsss"

IMPORT_EACH_ALONE = """
import importlib, pkgutil, sys
import wsss

failures = []
for name in sorted(m.name for m in pkgutil.walk_packages(wsss.__path__, "wsss.")):
    for loaded in [k for k in sys.modules if k.startswith("wsss.")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception as err:
        failures.append(f"{name}: {type(err).__name__}: {err}")
    if name.startswith("wsss.models") and "wsss.config" in sys.modules:
        failures.append(f"{name} imports wsss.config")
print("\\n".join(failures))
sys.exit(1 if failures else 0)
"""


@pytest.mark.slow
def test_every_module_imports_first_without_a_cycle():
    """Each module imported first, into an interpreter holding no other wsss module: a cycle shows up as an
    ImportError of a partly initialised module. ``wsss.models`` must not pull in ``wsss.config``."""
    proc = subprocess.run([sys.executable, "-c", IMPORT_EACH_ALONE], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]


def _function_local_wsss_imports(path: Path) -> list[str]:
    """``import wsss...`` statements below module level (``if TYPE_CHECKING:`` blocks and module-level ``try:``
    blocks, which guard a module that needs an optional dependency, excepted)."""
    tree = ast.parse(path.read_text())
    top = set()
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            top.update(id(n) for n in ast.walk(node))
        if isinstance(node, ast.Try):
            top.update(id(n) for n in node.body)
        top.add(id(node))
    found = []
    for node in ast.walk(tree):
        if id(node) in top or not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
        found += [f"{path.relative_to(WSSS.parent)}:{node.lineno} {n}" for n in names if n.split(".")[0] == "wsss"]
    return found


def test_no_function_local_imports_of_wsss_modules():
    """Optional heavy dependencies (pydensecrf, mmseg, onnxruntime) may be imported where needed; wsss may not."""
    found = [hit for path in sorted(WSSS.rglob("*.py")) for hit in _function_local_wsss_imports(path)]
    assert not found, found
