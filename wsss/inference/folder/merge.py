"""The end of a :func:`wsss.inference.folder.runner.run_inference` run: every rank's part merged into one summary that
accounts for every listed image, and the run files rank 0 writes (``image_labels.json``, the gallery,
``summary.json``)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from wsss.data.folder import Skipped
from wsss.inference.folder.gallery import present_indices, write_gallery
from wsss.inference.folder.layout import OutputLayout
from wsss.inference.folder.sources import FULL_DISK, OutputError, save_output
from wsss.utils.fileio import atomic_write_text

__all__ = ["InferenceSummary", "RankPart", "image_line", "merge_parts", "stopped", "write_run_files"]


@dataclass
class InferenceSummary:
    """What a run did.

    Attributes:
        output: The output folder.
        done: Images predicted in this run.
        existing: Images skipped because their outputs exist.
        skipped: Files not processed, with the reason (corrupt, unsafe path, not an image, ...).
        seconds: Wall time of the loop (model loading and listing excluded).
        notes: Warnings for the user.
        error: Why the run stopped early (an output that could not be written), else None.
        image: In a run on one image file, its ``labels/`` entry (``present``, ``top1_fallback``, ``scores``) with
            its ``path`` and the ``threshold`` (``infer.cls_thresh``), for :meth:`format`; else None.
    """

    output: Path
    done: int = 0
    existing: int = 0
    skipped: list[Skipped] = field(default_factory=list)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    image: dict[str, Any] | None = None

    @property
    def images_per_s(self) -> float:
        return self.done / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        out = {
            "output": str(self.output),
            "done": self.done,
            "existing": self.existing,
            "seconds": round(self.seconds, 3),
            "images_per_s": round(self.images_per_s, 3),
            "skipped": [asdict(s) for s in self.skipped],
            "notes": self.notes,
        }
        return out if self.error is None else {**out, "error": self.error}

    def format(self, max_lines: int = 20) -> str:
        """Human-readable summary (at most ``max_lines`` skipped files listed)."""
        lines = [
            f"done {self.done} images in {self.seconds:.1f} s ({self.images_per_s:.2f} images/s); "
            f"{self.existing} already done (outputs exist; --overwrite redoes them); "
            f"{len(self.skipped)} skipped"
        ]
        lines += [f"  skipped {s.path}: {s.reason}" for s in self.skipped[:max_lines]]
        if len(self.skipped) > max_lines:
            lines.append(f"  ... and {len(self.skipped) - max_lines} more, see {self.output / 'summary.json'}")
        lines += [f"note: {n}" for n in self.notes]
        lines += [] if self.image is None else [image_line(self.image)]
        lines.append(f"outputs in {self.output}")
        return "\n".join(lines)


def image_line(entry: dict[str, Any], others: int = 3) -> str:
    """One line of an image's classes: each present class with its score (or ``no class``), the rule that chose them,
    and the ``others`` most probable of the rest, e.g. ``photo.jpg: present dog 0.97, person 0.81 (score > 0.5); next
    most probable: cat 0.12, sofa 0.03, chair 0.02``.

    Args:
        entry: A ``labels/`` entry (``present``, ``top1_fallback``, ``scores`` by class name) with the image's
            ``path`` and the ``threshold`` the classes passed.
        others: How many of the classes not present to name.
    """
    scores, present = entry["scores"], entry["present"]
    shown = ", ".join(f"{name} {scores[name]:.2f}" for name in present) or "no class"
    if entry["top1_fallback"]:
        rule = f"the most probable: no class scores above {entry['threshold']}"
        rule += "" if present else "; the mask does not show it"
    else:
        rule = f"score > {entry['threshold']}"
    rest = sorted((n for n in scores if n not in present), key=lambda n: -scores[n])[:others]
    tail = "; next most probable: " + ", ".join(f"{n} {scores[n]:.2f}" for n in rest) if rest else ""
    return f"{entry['path']}: present {shown} ({rule}){tail}"


@dataclass
class RankPart:
    """What one rank did: images finished in this run, found finished, skipped; its loop's seconds; the output it
    could not write; how many of its images it did not reach."""

    finished: list[str] = field(default_factory=list)
    existing: list[str] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    seconds: float = 0.0
    failure: OutputError | None = None
    left: int = 0


def merge_parts(
    parts: list[RankPart], listed: list[str], skipped: list[Skipped], layout: OutputLayout
) -> InferenceSummary:
    """One summary of every rank's part: counts summed, the slowest rank's time, every skipped file sorted by path.

    Every listed image ends finished (its mask exists) or named as skipped: one that no rank accounts for, or whose
    mask is gone, is skipped with its reason, so a run never says "done" with outputs missing.

    Args:
        parts: Every rank's part, in rank order.
        listed: The images of the run (the listing every rank shared).
        skipped: The files skipped when listing.
        layout: The output folder.
    """
    finished = {rel for part in parts for rel in part.finished}
    existing = {rel for part in parts for rel in part.existing}
    dropped = {s.path for part in parts for s in part.skipped}
    stopped_early = any(part.failure is not None for part in parts)
    lost = []
    for rel in listed:
        if rel in finished or rel in existing:
            if not layout.paths(rel, ["masks"])["masks"].is_file():
                lost.append(Skipped(rel, "its mask vanished during the run; run again to redo it"))
        elif rel not in dropped and not stopped_early:
            lost.append(Skipped(rel, "no rank finished it (the input changed during the run?); run again"))
    gone = {s.path for s in lost}
    return InferenceSummary(
        output=layout.root,
        done=len(finished - gone),
        existing=len(existing - gone),
        skipped=sorted([*skipped, *(s for part in parts for s in part.skipped), *lost], key=lambda s: s.path),
        seconds=max(part.seconds for part in parts),
    )


def write_run_files(
    layout: OutputLayout,
    finished: list[str],
    classes: list[str],
    threshold: float,
    truth: dict[str, Path] | None,
    summary: InferenceSummary,
    failures: list[OutputError],
    left: int,
) -> list[str]:
    """``image_labels.json``, the gallery (``truth`` not None: the ground truth of each image that has one) and
    ``summary.json`` of the finished images; a file that cannot be written adds its error to ``failures``. Returns
    the names of the files not written."""
    unwritten: list[str] = []
    try:
        labels = _update_labels_file(layout, finished, classes, threshold)
    except OutputError as err:
        failures.append(err)
        unwritten.append(layout.labels_file.name)
        labels = {}
    if truth is not None:
        missing = {rel: _missing_for_gallery(layout, rel, labels, classes) for rel in finished}
        shown = [rel for rel, lost in missing.items() if lost is None]
        left_out = [lost for lost in missing.values() if lost is not None]
        if left_out:
            n = len(left_out)
            summary.notes.append(
                f"{n} finished image{'s' * (n != 1)} {'is' if n == 1 else 'are'} left out of index.html: gallery "
                f"files are missing (such as {left_out[0]}); --overwrite redoes them"
            )
        try:
            write_gallery(layout.root, shown, labels, threshold, classes, {r: truth[r] for r in shown if r in truth})
        except OutputError as err:
            failures.append(err)
            unwritten.append("index.html")
    if failures:
        summary.error = str(stopped(failures[0], summary.done, left, unwritten))
    try:
        save_output(layout.summary_file, atomic_write_text, json.dumps(summary.to_dict(), indent=2) + "\n")
    except OutputError as err:
        failures.append(err)
        unwritten.append(layout.summary_file.name)
    return unwritten


def stopped(failure: OutputError, done: int, left: int, unwritten: list[str]) -> OutputError:
    """``failure`` (the first output that could not be written) with what the run kept: ``done`` images finished,
    ``left`` not, the run files ``unwritten``."""
    fix = "free space" if failure.error.errno in FULL_DISK else "fix that"
    lost = f"; not written: {', '.join(unwritten)}" if unwritten else ""
    return OutputError(
        failure.path,
        failure.error,
        f"stopped with {done} image{'s' * (done != 1)} finished in this run (outputs complete), {left} not "
        f"finished{lost}; {fix} and run again: finished images are skipped",
    )


def _missing_for_gallery(layout: OutputLayout, rel: str, labels: dict[str, dict], classes: list[str]) -> Path | None:
    """The first file that the gallery row of ``rel`` needs and a run writes that is missing (its labels entry, its
    thumbnail, overlay, CAM, mask and the CAM thumbnail of each present class), or None."""
    if rel not in labels:
        return layout.paths(rel, ["labels"])["labels"]
    paths = layout.paths(rel, ["thumbs", "overlays", "cams", "masks"]).values()
    cams = layout.class_cam_paths(rel, present_indices(labels[rel], classes)).values()
    return next((p for p in (*paths, *cams) if not p.is_file()), None)


def _update_labels_file(
    layout: OutputLayout, finished: list[str], classes: list[str], threshold: float
) -> dict[str, dict]:
    """Merge the ``labels/`` entries of the finished images made for ``classes`` into ``image_labels.json``; return
    them."""
    images: dict[str, dict] = {}
    for rel in finished:
        try:
            entry = json.loads(layout.paths(rel, ["labels"])["labels"].read_text())
        except (OSError, ValueError):
            continue
        if isinstance(entry, dict) and entry.pop("classes", None) == list(classes):
            images[rel] = entry
    payload = {"classes": list(classes), "threshold": threshold, "images": dict(sorted(images.items()))}
    save_output(layout.labels_file, atomic_write_text, json.dumps(payload, indent=1) + "\n")
    return images
