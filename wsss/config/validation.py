"""The one config validator: types, choices and the range of every number.

Every numeric field of :mod:`wsss.config.schema` declares its range beside its default (:func:`bounded`); a section
checks its fields when it is built (:class:`Section`), whoever builds it: :func:`from_dict` for a config file, the
``--cfg-options`` merged into it, and the config inside a checkpoint or an export alike. NaN fails every range;
floats must be finite, and an integer too large for a float (``10**400``, :data:`FLOAT_MAX`) fails every range and
every float key. Where a range has no natural end (scales, iterations, workers, sizes) the ceiling is what
one machine can do, stated in the error (:data:`MAX_SCALE`, :data:`MAX_ITERATIONS`, :data:`MAX_SIDE`,
:data:`CPU_LIMIT`, :data:`MAX_ITEMS`).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import sys
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, Union

CPU_LIMIT = max(os.cpu_count() or 1, 2)
"""Ceiling of every process count (``infer.crf.workers``, ``data.num_workers``): this machine's CPUs, at least 2
(the defaults)."""

MAX_ITERATIONS = 100
"""Ceiling of the iterative refinements (``par.num_iter``, ``infer.crf.iterations``): 10x the paper's 10."""

MAX_SCALE = 4.0
"""Ceiling of every rescale factor (``data.scale_range``, ``cam.scales``, ``infer.scales``): the work grows with its
square, and with the square of the model's tokens again in attention."""

MAX_SIDE = 2048
"""Ceiling of an image side the model sees: ``data.crop_size``, and ``infer.max_size`` x the largest
``infer.scales`` (2x the default 1024; a DeiT-S/16 then sees at most 128 x 128 tokens)."""

MAX_ITEMS = 16
"""Most values in a list of scales or dilations (each adds a pass or a neighbour ring)."""

UINT8_MAX = 255
"""Masks are uint8 PNGs: ``data.ignore_index`` must be a value one can hold."""

FLOAT_MAX = sys.float_info.max
"""The largest float: every number of a config is used as one somewhere, so a larger integer holds no range."""


class ConfigError(ValueError):
    """A config value is unknown, of the wrong type or out of its range."""


@dataclass(frozen=True)
class Range:
    """The values a number may take: ``low``..``high``, each end open or closed; NaN and infinities never hold.

    Attributes:
        low: Smallest value (``-inf``: none).
        high: Largest value (``inf``: none, the value must still be finite).
        low_open: ``low`` itself is excluded.
        high_open: ``high`` itself is excluded.
        why: Where the ceiling comes from, shown in the error (a machine limit).
    """

    low: float = -math.inf
    high: float = math.inf
    low_open: bool = False
    high_open: bool = False
    why: str = ""

    def holds(self, value: float) -> bool:
        if abs(value) > FLOAT_MAX or not math.isfinite(value):  # first: math.isfinite overflows on such an integer
            return False
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def text(self, real: bool = False) -> str:
        """``> 0``, ``>= 0``, ``in [0, 1]``, ``in (0, 4]`` or ``finite``, with the reason of a ceiling; for a ``real``
        (float) value, ``finite and > 0``: an unbounded end still excludes infinity."""
        low, high = _number(self.low), _number(self.high)
        if self.low == -math.inf and self.high == math.inf:
            rule = "finite"
        elif self.high == math.inf:
            rule = f"{'finite and ' if real else ''}{'>' if self.low_open else '>='} {low}"
        else:
            rule = f"in {'(' if self.low_open else '['}{low}, {high}{')' if self.high_open else ']'}"
        return f"{rule} ({self.why})" if self.why else rule


def _number(value: float) -> str:
    """``0``, ``2147483647``, ``0.5``: an integral bound without a fraction or an exponent."""
    return str(int(value)) if math.isfinite(value) and float(value).is_integer() else f"{value:g}"


def fits_float(value: Any) -> bool:
    """``value`` is a number (an int or a float, not a bool) a float holds: NaN and the finite floats, any int up to
    :data:`FLOAT_MAX` in magnitude; not an infinity. For numbers read from JSON, which Python reads without a bound."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return number and not abs(value) > FLOAT_MAX


def shown(value: Any) -> str:
    """``repr(value)`` for an error message, but an integer too large for a float by its size: its digits would fill
    the screen, and past 4300 of them Python refuses to write it."""
    if isinstance(value, int) and abs(value) > FLOAT_MAX:
        return f"an integer of {math.floor(math.log10(abs(value))) + 1} digits (above {FLOAT_MAX:g}, the largest float)"
    return repr(value)


FINITE = Range()
POSITIVE = Range(0, low_open=True)
NON_NEGATIVE = Range(0)
UNIT = Range(0, 1)
"""A probability or a fraction."""
ITERATIONS = Range(0, MAX_ITERATIONS, why=f"ceiling {MAX_ITERATIONS}, 10x the paper's 10")
WORKERS = Range(0, CPU_LIMIT, why=f"at most max(2, os.cpu_count()) = {CPU_LIMIT} on this machine")
SCALE = Range(0, MAX_SCALE, low_open=True, why=f"ceiling {MAX_SCALE:g}: the work grows with the square of a scale")
SIDE = Range(1, MAX_SIDE, why=f"ceiling {MAX_SIDE} px: attention's work grows with the square of the tokens")


def bounded(default: Any, rng: Range, max_items: int | None = None) -> Any:
    """A numeric field whose value (each value, for a list) must lie in ``rng`` (checked by :class:`Section`).

    Args:
        default: The default value.
        rng: The allowed values.
        max_items: For a list of any length: it must hold 1 to ``max_items`` values.
    """
    return field(default=default, metadata={"range": rng, "max_items": max_items})


def choice(default: str, *others: str) -> Any:
    """A string field that accepts only ``default`` or one of ``others`` (checked by :func:`from_dict`)."""
    return field(default=default, metadata={"choices": (default, *others)})


class Section:
    """Base of every config section: built, it checks the range of each :func:`bounded` field.

    ``KEY`` is the section's dotted place in :class:`~wsss.config.schema.Config`, which every error names.
    A section with relations between its fields checks them in its own ``__post_init__`` after this one.
    """

    KEY: ClassVar[str] = ""

    def __post_init__(self) -> None:
        for spec in dataclasses.fields(self):  # type: ignore[arg-type]
            if "range" in spec.metadata:
                key, value = join_key(self.KEY, spec.name), getattr(self, spec.name)
                check_range(key, value, spec.metadata["range"], spec.metadata["max_items"])


def check_range(key: str, value: Any, rng: Range, max_items: int | None = None) -> None:
    """Raise ConfigError naming ``key``, the value and ``rng`` unless ``value`` (None: unset, always valid; a list:
    each of its values, and 1 to ``max_items`` of them) lies in ``rng``."""
    if value is None:
        return
    if isinstance(value, (list, tuple)):
        if max_items is not None and not 1 <= len(value) <= max_items:
            listed = ", ".join(map(shown, value))
            raise ConfigError(f"config key '{key}': must hold 1 to {max_items} values, got {len(value)}: [{listed}]")
        for i, item in enumerate(value):
            check_range(f"{key}[{i}]", item, rng)
        return
    if not rng.holds(value):
        raise ConfigError(f"config key '{key}': must be {rng.text(isinstance(value, float))}, got {shown(value)}")


def check_order(key: str, low: float, high: float) -> None:
    """Raise ConfigError unless the pair ``(low, high)`` of ``key`` is in order."""
    if not low <= high:
        raise ConfigError(f"config key '{key}': the first value must be <= the second, got ({low!r}, {high!r})")


def check_ignore_index(ignore_index: int, num_classes: int, key: str = "data.ignore_index") -> None:
    """Raise ConfigError unless ``ignore_index`` is a uint8 mask value above every class index."""
    if not num_classes <= ignore_index <= UINT8_MAX:
        raise ConfigError(
            f"config key '{key}': must be in [{num_classes}, {UINT8_MAX}] (a uint8 mask value that is no class "
            f"index: there are {num_classes} classes), got {ignore_index!r}"
        )


def check_mean_std(mean: Any, std: Any) -> None:
    """Raise ConfigError unless ``mean`` and ``std`` (a checkpoint's normalisation) are 3 finite numbers each and
    every ``std`` is > 0."""
    for name, values, rng in (("mean", mean, FINITE), ("std", std, POSITIVE)):
        if not isinstance(values, (list, tuple)) or len(values) != 3:
            raise ConfigError(f"checkpoint '{name}': expected 3 numbers (R, G, B), got {values!r}")
        for i, value in enumerate(values):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"checkpoint '{name}[{i}]': expected a number, got {shown(value)}")
            if not rng.holds(value):
                raise ConfigError(f"checkpoint '{name}[{i}]': must be {rng.text(real=True)}, got {shown(value)}")


def from_dict(cls: type, data: Any, key: str = "") -> Any:
    """Validate a nested dict into dataclass ``cls``.

    Args:
        cls: The dataclass to build.
        data: A mapping of field names to values (nested mappings for nested dataclasses).
        key: Dotted prefix of ``data`` within the whole config, used in error messages.

    Raises:
        ConfigError: On an unknown key, a value of the wrong type or out of its range; the message names the key.
    """
    where = key or "config"
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a dict, got {type(data).__name__} {data!r}")
    names = [f.name for f in dataclasses.fields(cls)]
    for name in data:
        if name not in names:
            close = difflib.get_close_matches(str(name), names, n=1)
            hint = f" Did you mean '{join_key(key, close[0])}'?" if close else ""
            raise ConfigError(f"unknown config key '{join_key(key, name)}'.{hint} Valid keys here: {', '.join(names)}")
    hints = typing.get_type_hints(cls)
    choices = {f.name: f.metadata["choices"] for f in dataclasses.fields(cls) if "choices" in f.metadata}
    values = {name: coerce(hints[name], value, join_key(key, name)) for name, value in data.items()}
    for name, value in values.items():
        if name in choices and value not in choices[name]:
            raise ConfigError(
                f"config key '{join_key(key, name)}': {value!r} is not one of {', '.join(map(repr, choices[name]))}"
            )
    return cls(**values)


def fit_workers(cls: type, data: Any) -> Any:
    """``data``, a config dict of ``cls`` saved on another machine (a checkpoint's, an export's), with every process
    count above this machine's :data:`CPU_LIMIT` lowered to it; ``data`` itself is not changed.

    A worker count is this machine's resource, not a property of the model: a checkpoint trained with 8 loaders on
    a 16-core node must still load on a 4-core laptop, where ``--cfg-options`` cannot reach the embedded config
    before it is checked. Values from a config file or ``--cfg-options`` stay checked as written.
    """
    if not isinstance(data, dict):
        return data  # from_dict names what it should be
    fitted, hints = dict(data), typing.get_type_hints(cls)
    for spec in dataclasses.fields(cls):
        value = fitted.get(spec.name)
        if spec.metadata.get("range") is WORKERS and type(value) is int and value > CPU_LIMIT:
            fitted[spec.name] = CPU_LIMIT
        elif isinstance(value, dict) and dataclasses.is_dataclass(hints[spec.name]):
            fitted[spec.name] = fit_workers(hints[spec.name], value)
    return fitted


def join_key(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else str(name)


def coerce(tp: Any, value: Any, key: str) -> Any:
    """Check ``value`` against type ``tp`` and convert lists to tuples where the type says tuple.

    Raises:
        ConfigError: A value of another type; the message names ``key``.
    """
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, key)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        for arg in args:
            try:
                return coerce(arg, value, key)
            except ConfigError:
                pass
        raise ConfigError(f"config key '{key}': {shown(value)} matches none of {str(tp).replace('typing.', '')}")
    if tp is type(None):
        if value is not None:
            raise ConfigError(f"config key '{key}': expected None, got {shown(value)}")
        return None
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"config key '{key}': expected a number, got {shown(value)}")
        if abs(value) > FLOAT_MAX and isinstance(value, int):
            raise ConfigError(f"config key '{key}': expected a number a float can hold, got {shown(value)}")
        return float(value)
    if tp in (int, bool, str):
        if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
            raise ConfigError(f"config key '{key}': expected {tp.__name__}, got {shown(value)}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"config key '{key}': expected a list, got {shown(value)}")
        if origin is list or (len(args) == 2 and args[1] is Ellipsis):
            items = [coerce(args[0], v, f"{key}[{i}]") for i, v in enumerate(value)]
        else:
            if len(value) != len(args):
                raise ConfigError(f"config key '{key}': expected {len(args)} values, got {shown(value)}")
            items = [coerce(a, v, f"{key}[{i}]") for i, (a, v) in enumerate(zip(args, value, strict=True))]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise ConfigError(f"config key '{key}': expected a dict with string keys, got {shown(value)}")
        return {k: coerce(args[1], v, f"{key}.{k}") for k, v in value.items()}
    raise TypeError(f"unsupported config field type {tp!r} for '{key}'")
