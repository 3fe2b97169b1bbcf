"""Config files read, overridden and written: ``_base_`` inheritance and ``--cfg-options`` as mmseg users know them.

A config file is Python, run by ``mmengine.Config.fromfile`` with the user's rights (mmengine's convention): it is
code, to be trusted like a script. :func:`load_config` runs it; nothing else here runs anything. The config inside a
checkpoint or an export is data: it reaches :func:`~wsss.config.validation.from_dict` as plain dicts and lists
(:mod:`wsss.model_file`), and :func:`apply_options` merges overrides into such data without reading a file.
"""

from __future__ import annotations

import ast
import dataclasses
import math
from pathlib import Path
from typing import Any

from wsss.config.schema import Config
from wsss.config.validation import ConfigError, from_dict
from wsss.utils.fileio import atomic_write_text


def to_dict(cfg: Config) -> dict[str, Any]:
    """The config as plain nested dicts, lists and tuples (safe for ``torch.load(weights_only=True)``)."""
    return dataclasses.asdict(cfg)


def load_config(path: str | Path, options: dict[str, Any] | None = None) -> Config:
    """Load a Python config file (with ``_base_`` inheritance) and apply dotted-key overrides.

    The file and its ``_base_`` files are run as Python with the caller's rights (mmengine's convention): a config
    file is code, to be trusted as a script is. Never call this on a file from a checkpoint or a stranger.

    Args:
        path: The config file.
        options: ``{"a.b": value}`` overrides, as parsed from ``--cfg-options a.b=value``.

    Raises:
        FileNotFoundError: The file, or a ``_base_`` file, does not exist.
        ConfigError: An unknown key, a wrong type or a value out of range (in the file or in the overrides), or a
            config file that is not one: a folder, not ``.py``, a Python syntax error, a ``_base_`` cycle
            (:func:`check_config_files`).
    """
    from mmengine.config import Config as MMConfig

    path = Path(path)
    if path.is_dir():
        found = ", ".join(sorted(p.name for p in path.glob("*.py"))[:3])
        raise ConfigError(f"{path} is a directory, not a config file; give a .py file in it ({found or 'none there'})")
    if not path.is_file():
        raise FileNotFoundError(f"config file not found: {path}")
    check_config_files(path)
    raw = MMConfig.fromfile(str(path))
    if options:
        raw.merge_from_dict(options)
    data = raw.to_dict()
    data.pop("_base_", None)
    return from_dict(Config, data)


def check_config_files(path: Path, chain: tuple[Path, ...] = ()) -> None:
    """Check a config file and its ``_base_`` files, each in one line naming the file, where mmengine would give a
    traceback or a misleading message: a Python syntax error (with its line), a ``_base_`` cycle, a ``_base_``
    that is missing, a folder or not a ``.py`` config. ``pkg::path`` bases are left to mmengine.

    Args:
        path: An existing config file.
        chain: The files that led to ``path`` through their ``_base_`` (resolved), for the cycle check.

    Raises:
        FileNotFoundError: A ``_base_`` file does not exist.
        ConfigError: Any other of the above.
    """
    if path.suffix != ".py":
        raise ConfigError(f"{path}: a config file is Python (.py); give the .py config")
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text ({err.reason}, byte {err.start}); save it as UTF-8") from None
    except SyntaxError as err:
        raise ConfigError(f"{path} line {err.lineno}: Python syntax error ({err.msg}); fix the config there") from None
    chain = (*chain, path.resolve())
    for base in _base_names(tree, path):
        if "::" in base:
            continue
        target = path.parent / base
        if target.resolve() in chain:
            cycle = chain[chain.index(target.resolve()) :] + (target.resolve(),)
            raise ConfigError(f"_base_ cycle: {' -> '.join(map(str, cycle))}; remove the _base_ of one of them")
        if target.is_dir():
            raise ConfigError(f"{path}: _base_ '{base}' is a directory; name a .py config file in it")
        if not target.is_file():
            raise FileNotFoundError(
                f"{path}: _base_ '{base}' not found ({target}); _base_ paths are relative to the file that names them"
            )
        if target.suffix != ".py":
            raise ConfigError(f"{path}: _base_ '{base}' is not a Python config file (.py); point it at a .py config")
        check_config_files(target, chain)


def _base_names(tree: ast.Module, path: Path) -> list[str]:
    """The file names of the first top-level ``_base_ = ...`` of a parsed config (mmengine reads that one)."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and node.targets[0].id == "_base_":
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                value = None
            names = [value] if isinstance(value, str) else value
            if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
                raise ConfigError(
                    f"{path}: _base_ must be a file name or a list of file names (line {node.lineno}), "
                    f"got {ast.unparse(node.value)}"
                )
            return list(names)
    return []


def apply_options(cfg: Config, options: dict[str, Any], prefix: str = "") -> Config:
    """``cfg`` with ``{"a.b": value}`` overrides merged as ``--cfg-options`` merges them, validated again.

    Args:
        cfg: The config to override (not modified).
        options: Dotted keys -> values, as :func:`parse_cfg_options` returns them.
        prefix: If given, only keys under it are allowed (``"infer."`` for inference settings).

    Raises:
        ConfigError: A key outside ``prefix``, an unknown key, a wrong type or a value out of range.
    """
    from mmengine.config import Config as MMConfig

    outside = [k for k in options if not k.startswith(prefix)]
    if outside:
        raise ConfigError(f"--cfg-options: only {prefix}* keys can be set here, got '{outside[0]}'")
    raw = MMConfig(to_dict(cfg))
    raw.merge_from_dict(options)
    return from_dict(Config, raw.to_dict())


def dump_config(cfg: Config, path: str | Path) -> None:
    """Write ``cfg`` as a self-contained Python config file that :func:`load_config` reads back identically."""
    lines = ["# Resolved wsss config: every value explicit, no _base_.\n"]
    for name, value in to_dict(cfg).items():
        lines.append(f"{name} = {_literal(value)}\n")
    atomic_write_text(path, "".join(lines))


def _literal(value: Any, indent: int = 0) -> str:
    """Python source for a nested value, one dict item per line; non-finite floats as ``float('nan')``."""
    pad = "    " * (indent + 1)
    if isinstance(value, dict):
        if not value:
            return "{}"
        items = "".join(f"{pad}{k!r}: {_literal(v, indent + 1)},\n" for k, v in value.items())
        return "{\n" + items + "    " * indent + "}"
    if isinstance(value, (list, tuple)):
        body = ", ".join(_literal(v, indent + 1) for v in value)
        if isinstance(value, list):
            return f"[{body}]"
        return f"({body},)" if len(value) == 1 else f"({body})"
    if isinstance(value, float) and not math.isfinite(value):
        return f"float('{value}')"
    return repr(value)


def parse_cfg_options(items: list[str] | None) -> dict[str, Any]:
    """Parse ``["a.b=1", "c=[1,2]"]`` as mmengine's ``DictAction`` does (numbers, booleans, None, lists as
    ``[a, b]`` or ``a,b``, tuples as ``(a, b)``, surrounding quotes dropped), but keep the spaces of a value as
    typed: ``data.root=/data/my set`` stays ``/data/my set`` (``DictAction`` removes every space). List and tuple
    items lose only the spaces around them.

    Raises:
        ConfigError: An item without ``=``, or a value with unbalanced brackets.
    """
    out: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            raise ConfigError(f"--cfg-options expects key=value, got '{item}'")
        key, value = item.split("=", 1)
        out[key] = _parse_value(value.strip("'\""), item)
    return out


def _parse_value(text: str, item: str) -> Any:
    """A list for ``[...]`` or ``a,b``, a tuple for ``(...)``, else a number, bool, None or ``text`` itself."""
    bare = text.strip()
    if bare[:1] + bare[-1:] in ("[]", "()"):
        values = _parse_items(bare[1:-1], item)
        return tuple(values) if bare[0] == "(" else values
    if "," in bare:
        return _parse_items(bare, item)
    for number in (int, float):
        try:
            return number(bare)
        except ValueError:
            pass
    if bare.lower() in ("true", "false"):
        return bare.lower() == "true"
    return None if bare == "None" else text


def _parse_items(body: str, item: str) -> list[Any]:
    """The comma-separated values of ``body``, split outside brackets; a trailing comma adds nothing."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(body):
        depth += (char in "([") - (char in ")]")
        if depth < 0:
            break
        if char == "," and depth == 0:
            parts.append(body[start:i])
            start = i + 1
    if depth != 0:
        raise ConfigError(f"--cfg-options: unbalanced brackets in '{item}'")
    parts.append(body[start:])
    if not parts[-1].strip():
        parts.pop()
    return [_parse_value(part.strip().strip("'\""), item) for part in parts]
