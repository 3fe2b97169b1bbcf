"""What a :func:`wsss.inference.folder.runner.run_inference` run will do, decided before any image is read: the images
(listed once, on rank 0, and sent to every rank), the images skipped with their reasons, the output folder
prepared (rank 0), and each rank's images to run and images already done.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wsss.data.folder import Skipped
from wsss.inference.folder.gallery import find_ground_truth
from wsss.inference.folder.layout import OutputLayout
from wsss.inference.folder.sources import (
    Source,
    input_files,
    inside,
    list_file,
    list_folder,
    list_split,
    overwritten_input,
    save_output,
    writing,
)
from wsss.utils.distributed import from_rank0
from wsss.utils.fileio import atomic_write_text

__all__ = ["Listing", "list_inputs", "prepare_output", "split_done"]

SETTINGS_THAT_CHANGE_OUTPUTS = (
    "checkpoint", "scales", "flip", "max_size", "mask_classes", "crf", "crf_config", "dtype",
)  # fmt: skip
"""The ``run.json`` settings whose change makes earlier outputs differ from this run's."""
LATER_SETTINGS = {"dtype": "float32"}
"""Settings a ``run.json`` written before they existed lacks (a folder run's, a pseudo-label export's), with the value
they stood for there: every model ran in float32 before ``infer.dtype``."""


@dataclass
class Listing:
    """The images of a run, the same on every rank.

    Attributes:
        sources: The images, sorted, with no two writing one file and every name writable.
        skipped: Files listed but not read, with the reason (unsafe, not an image, a name clash, too long a name).
        truth: The ground-truth mask of each image that has one (a VOC split).
        inputs: The files behind ``sources`` and ``truth`` by identity
        (:func:`~wsss.inference.folder.sources.input_files`).
    """

    sources: list[Source]
    skipped: list[Skipped] = field(default_factory=list)
    truth: dict[str, Path] = field(default_factory=dict)
    inputs: dict[tuple[int, int], Path] = field(default_factory=dict)


def list_inputs(
    input_path: Path,
    layout: OutputLayout,
    split: str | None,
    list_path: str | Path | None,
    mask_dirs: tuple[str, ...],
    follow_symlinks: bool,
) -> Listing:
    """List the images once, on rank 0, and send the listing to every rank (an error too: every rank raises it).

    Args:
        input_path: An image file, a folder, the folder of ``list_path`` or a VOC root of ``split``.
        layout: The output folder (its files are never inputs; names too long for it are skipped).
        split: A VOC split name or file, or None.
        list_path: A text file of image paths, or None.
        mask_dirs: Where a split's ground truth may be, first found wins.
        follow_symlinks: Read symlinks to files outside the input folder.
    """
    return from_rank0(lambda: _listing(input_path, layout, split, list_path, mask_dirs, follow_symlinks))


def _listing(
    input_path: Path,
    layout: OutputLayout,
    split: str | None,
    list_path: str | Path | None,
    mask_dirs: tuple[str, ...],
    follow_symlinks: bool,
) -> Listing:
    truth = {}
    if split is not None:
        sources, skipped = list_split(input_path, split, follow_symlinks)
        truth = find_ground_truth(input_path, mask_dirs, [s.rel for s in sources])
    elif list_path is not None:
        sources, skipped = list_file(input_path, list_path, follow_symlinks)
    elif input_path.is_file():
        sources, skipped = [Source(input_path.name, input_path)], []
    else:
        sources, skipped = list_folder(input_path, layout, follow_symlinks)
    inputs = input_files([*(s.path for s in sources), *truth.values()])
    kept, refused = _claim(sources, layout)
    return Listing(kept, skipped + refused, truth, inputs)


def _claim(sources: list[Source], layout: OutputLayout) -> tuple[list[Source], list[Skipped]]:
    """Sources whose outputs can be written and no earlier source takes (``a.jpg`` and ``a.png`` both write
    ``masks/a.png``), and the others skipped; decided on the whole list before it is shared out, so no two ranks
    write one file."""
    kept, skipped, claimed = [], [], {}
    for src in sources:
        key = layout.paths(src.rel, ["masks"])["masks"].as_posix()
        problem = layout.unwritable(src.rel)
        if problem is not None:
            skipped.append(Skipped(src.rel, problem))
        elif key in claimed:
            skipped.append(Skipped(src.rel, f"its outputs would overwrite those of {claimed[key]}"))
        else:
            claimed[key] = src.rel
            kept.append(src)
    return kept, skipped


def prepare_output(layout: OutputLayout, settings: dict[str, Any]) -> list[str]:
    """On rank 0, while the other ranks wait: create OUTPUT, remove the temporaries of killed runs (of this host,
    in OUTPUT's own folders only), write ``run.json``. Returns the settings that differ from the earlier run's
    (:data:`SETTINGS_THAT_CHANGE_OUTPUTS`), the same on every rank."""

    def prepare() -> list[str]:
        with writing(layout.root):
            layout.root.mkdir(parents=True, exist_ok=True)
        layout.remove_stale_temporaries()
        changed = _changed_settings(layout.run_file, settings)
        save_output(layout.run_file, atomic_write_text, json.dumps(settings, indent=2) + "\n")
        return changed

    return from_rank0(prepare)


def _changed_settings(run_file: Path, settings: dict[str, Any]) -> list[str]:
    """The settings that differ from those of the earlier run (its ``run.json``)."""
    try:
        previous = json.loads(run_file.read_text())
    except (OSError, ValueError):
        return []
    return [k for k in SETTINGS_THAT_CHANGE_OUTPUTS if previous.get(k, LATER_SETTINGS.get(k)) != settings[k]]


def split_done(
    sources: list[Source], layout: OutputLayout, inputs: dict[tuple[int, int], Path], overwrite: bool
) -> tuple[list[tuple[Source, dict[str, Path]]], list[str], list[Skipped]]:
    """Split this rank's sources into those to run (with their output paths), those already finished, and those
    skipped because an output is unsafe (resolving outside OUTPUT, or one of the ``inputs`` files)."""
    todo, done, skipped = [], [], []
    for src in sources:
        problem = _unsafe_output(layout.written(src.rel), layout.root, inputs)
        if problem is not None:
            skipped.append(Skipped(src.rel, problem))
        elif not overwrite and layout.finished(src.rel):
            done.append(src.rel)
        else:
            todo.append((src, layout.paths(src.rel)))
    return todo, done, skipped


def _unsafe_output(written: list[Path], output: Path, inputs: dict[tuple[int, int], Path]) -> str | None:
    escaped = next((p for p in written if not inside(p, output)), None)
    if escaped is not None:
        return f"output {escaped} resolves outside the output folder ({os.path.realpath(escaped)})"
    found = next(((p, f) for p in written if (f := overwritten_input(p, inputs)) is not None), None)
    if found is not None:
        return f"its output {found[0]} is the input file {found[1]}; an output never overwrites an input"
    return None

