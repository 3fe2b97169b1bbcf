"""The evaluation protocol behind a score, recorded beside it and printed with it.

``tools/test.py`` and ``tools/eval_cams.py`` print :meth:`EvalProtocol.line` above their tables and write
:meth:`EvalProtocol.to_dict` into the files they write (``metrics.json``, ``cam_eval.json``, ``submission.json``,
key ``protocol``); ``tools/report.py`` reads it back from there, so a table never shows a number without the
settings that produced it: test-time scales and flip, CRF on or off, which classes the masks may hold, the split with
its number of images (and whether it is the full val set), the checkpoint with its training step, and on a GPU how
it computed float32 products and whether the model ran in bf16.
"""

from __future__ import annotations

import reprlib
import types
import typing
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from wsss.config import fits_float
from wsss.data.classes import VOC_CLASSES
from wsss.evaluation.paper_tables import VOC_SPLIT_IMAGES

LATER_FIELDS = {"max_size": None, "scored": True, "fp32_precision": None, "dtype": "float32"}
"""Fields a protocol written by an older version lacks, with the value they stand for there (every run was scored;
``max_size`` and the float32 products were not recorded; every model ran in float32)."""


@dataclass(frozen=True)
class EvalProtocol:
    """How a score was produced.

    Attributes:
        checkpoint: The model file evaluated.
        step: Its training step (None when the file does not record one).
        split: The split name or file.
        num_images: Images evaluated.
        split_images: Ids the split lists.
        val_split: The config's validation split (``data.val_split``).
        voc: The class list is VOC's 21 (the split sizes of the paper apply).
        scales: Test-time (or CAM) scales.
        flip: Horizontal-flip augmentation.
        crf: Dense-CRF refinement.
        mask_classes: Which classes a mask may hold (``infer.mask_classes``, or the ground-truth labels for CAMs).
        max_size: Longest side the model sees (``infer.max_size``; None: not capped or not applicable).
        scored: The predictions were scored against ground truth (False: ``--format-only``).
        fp32_precision: A GPU's float32 products while the model ran (``infer.fp32_precision``: ``tf32`` or
            ``ieee``); None on a CPU, or not recorded.
        dtype: The model's precision (``infer.dtype`` on a GPU: ``float32`` or ``bfloat16``, bf16 autocast; a CPU's
            is ``float32``).
    """

    checkpoint: str
    step: int | None
    split: str
    num_images: int
    split_images: int
    val_split: str
    voc: bool
    scales: tuple[float, ...]
    flip: bool
    crf: bool
    mask_classes: str
    max_size: int | None = None
    scored: bool = True
    fp32_precision: str | None = None
    dtype: str = "float32"

    @property
    def full_val(self) -> bool:
        """The split is the config's val split, every id of it is evaluated, and on VOC it holds the paper's 1449."""
        name = Path(self.split).stem
        if name != Path(self.val_split).stem or self.num_images != self.split_images:
            return False
        return not self.voc or self.num_images == VOC_SPLIT_IMAGES.get(name, self.num_images)

    def split_text(self) -> str:
        """The split, its size, and whether it is complete: ``split val, 1449 of 1449 images: the full VOC val set``."""
        name = Path(self.split).stem
        text = f"split {self.split}, {self.num_images} of {self.split_images} images"
        expected = VOC_SPLIT_IMAGES.get(name) if self.voc else None
        complete = self.num_images == self.split_images == (expected or self.split_images)
        if expected is not None:
            text += f": {'the full' if complete else 'NOT the full'} VOC {name} set ({expected} images)"
        elif name == Path(self.val_split).stem:
            text += f": {'the full' if complete else 'NOT the full'} val split"
        else:
            text += f": {'all' if complete else 'a part'} of the split, not the val set"
        return text + ("" if self.scored else ", not scored (--format-only)")

    def line(self) -> str:
        """One line: ``protocol: checkpoint ...; split ...; scales ..., flip on, CRF off, mask_classes ...`` (and on a
        GPU ``, float32 products tf32``, with ``, model bf16 autocast`` before it where the model ran so)."""
        step = "step unknown" if self.step is None else f"step {self.step}"
        scales = ", ".join(f"{s:g}" for s in self.scales)
        size = "" if self.max_size is None else f", max_size {self.max_size or 'uncapped'}"
        products = "" if self.dtype == "float32" else ", model bf16 autocast"
        products += "" if self.fp32_precision is None else f", float32 products {self.fp32_precision}"
        return (
            f"protocol: checkpoint {Path(self.checkpoint).name} ({step}); {self.split_text()}; scales ({scales}), "
            f"flip {'on' if self.flip else 'off'}, CRF {'on' if self.crf else 'off'}, mask_classes "
            f"{self.mask_classes}{size}{products}"
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, with ``full_val`` and ``line`` for readers that only print."""
        return {**asdict(self), "scales": list(self.scales), "full_val": self.full_val, "line": self.line()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EvalProtocol:
        """The inverse of :meth:`to_dict` (its derived keys ignored); :data:`LATER_FIELDS` may be missing.

        Raises:
            ValueError: A key is missing, or holds a value of another type than its field's.
        """
        names = [f.name for f in fields(cls)]
        missing = [n for n in names if n not in data and n not in LATER_FIELDS]
        if missing:
            raise ValueError(f"protocol without {', '.join(missing)}")
        values = {**LATER_FIELDS, **{n: data[n] for n in names if n in data}}
        for name, tp in typing.get_type_hints(cls).items():
            if not _of_type(tp, values[name]):
                raise ValueError(f"protocol '{name}' is {reprlib.repr(values[name])}, not {_type_name(tp)}")
        return cls(**{**values, "scales": tuple(values["scales"])})


def _type_name(tp: Any) -> str:
    """``str``, ``int | None``, ``tuple[float, ...]``."""
    return tp.__name__ if isinstance(tp, type) else str(tp)


def _of_type(tp: Any, value: Any) -> bool:
    """``value``, read from JSON, is of the type ``tp`` of a protocol field (a tuple as a list; a float in range)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return any(_of_type(arg, value) for arg in args)
    if origin is tuple:
        return isinstance(value, (list, tuple)) and all(_of_type(args[0], item) for item in value)
    if tp is float:
        return fits_float(value)
    return isinstance(value, tp) and not (tp is int and isinstance(value, bool))


def run_dir_name(checkpoint: str | Path, split: str | None, tta: bool, crf: bool) -> str:
    """The folder ``tools/test.py`` writes a run's ``metrics.json`` to under its work dir:
    ``test_<checkpoint name>[_<split name>][_tta][_crf]`` (the split only when one is given)."""
    split_part = f"_{Path(split).stem}" if split else ""
    return f"test_{Path(checkpoint).stem}{split_part}{'_tta' if tta else ''}{'_crf' if crf else ''}"


def is_voc(classes: list[str] | tuple[str, ...]) -> bool:
    """The class list is VOC's 21, in VOC's order."""
    return tuple(classes) == VOC_CLASSES
