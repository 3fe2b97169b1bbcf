"""PASCAL VOC 2012 + SBD, or MS COCO 2014, from nothing to the layout the configs read (``tools/prepare_data.py``).

The steps, in order, each skipped on a re-run once finished:

1. per archive: fetch it (:mod:`wsss.data.prepare.download`: the user's folder, a mirror or the official address;
   checksum checked) and unpack it (:mod:`wsss.data.prepare.extract`: safe, all-or-nothing);
2. VOC: SBD's masks and the ``train_aug`` split (:func:`wsss.data.prepare.sbd.convert_sbd`), then the image-level labels
   from the XML annotations (:func:`wsss.data.labels.make_label_file`); COCO: masks, splits, labels and class
   list (:func:`wsss.data.prepare.coco.convert_coco`);
3. the dataset check of ``tools/check_dataset.py`` (:func:`wsss.data.check.check_dataset`).

A finished step leaves ``ROOT/.prepare/<dataset>/<step>.json`` listing its outputs; it counts as finished while
that record and every output exist (a damaged record counts as none). When a step runs, its record goes first, and
the steps derived from it (conversion, labels, check) run again after it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from wsss.config import DataConfig
from wsss.data.check import check_dataset
from wsss.data.labels import make_label_file
from wsss.data.prepare.coco import SPLITS, convert_coco
from wsss.data.prepare.download import Archive, FetchOptions, PrepareError, fetch_archive, read_record
from wsss.data.prepare.extract import extract_archive
from wsss.data.prepare.sbd import convert_sbd
from wsss.utils.fileio import atomic_write_text

__all__ = ["DATASETS", "Dataset", "prepare"]

COCO_VAL_PART = 5000
"""Length of COCO's ``val_part`` split (ToCo's validation subset, the one ``configs/coco_centered.py`` reads)."""


@dataclass(frozen=True)
class Dataset:
    """What to fetch for a dataset, where it unpacks under ROOT, and the ``data`` settings of its config."""

    folder: str
    """Folder under ROOT that the archives unpack into."""
    archives: tuple[Archive, ...]
    data: dict = field(default_factory=dict)
    """``DataConfig`` values of the config that reads the result; ``root`` relative to ROOT."""


DATASETS = {
    "voc": Dataset(
        folder=".",
        archives=(  # addresses and MD5s as torchvision's VOCSegmentation and SBDataset carry them; the sizes their
            # servers report (Content-Length), which cap a download
            Archive(
                "VOCtrainval_11-May-2012.tar",
                "https://thor.robots.ox.ac.uk/pascal/VOC/voc2012/VOCtrainval_11-May-2012.tar",
                md5="6cd6e144f989b92b3379bac3b3de84fd",
                size=1_999_639_040,
            ),
            Archive(
                "benchmark.tgz",
                "https://www2.eecs.berkeley.edu/Research/Projects/CS/vision/grouping/semantic_contours/benchmark.tgz",
                md5="82b4d87ceb2ed10f6038a1cba92111cb",
                size=1_419_539_633,
            ),
        ),
        data=dict(root="VOCdevkit/VOC2012"),
    ),
    "coco": Dataset(
        folder="coco",
        archives=(  # cocodataset.org publishes no checksums: the sizes its server reports are checked
            Archive("train2014.zip", "http://images.cocodataset.org/zips/train2014.zip", size=13_510_573_713),
            Archive("val2014.zip", "http://images.cocodataset.org/zips/val2014.zip", size=6_645_013_297),
            Archive(
                "annotations_trainval2014.zip",
                "http://images.cocodataset.org/annotations/annotations_trainval2014.zip",
                size=252_872_794,
            ),
        ),
        data=dict(
            root="coco",
            image_dir=".",
            classes="classes.txt",
            train_split="train",
            val_split="val_part",
            mask_dir="SegmentationClass",
        ),
    ),
}
"""The datasets ``tools/prepare_data.py`` makes; tests pass their own archives to :func:`prepare`."""


@dataclass(frozen=True)
class _Step:
    name: str
    run: Callable[[], tuple[str, list[Path]]]
    """Does the work; returns a summary line and the outputs whose presence means the step is finished."""
    derived: bool
    """Its record is dropped whenever an earlier step runs, so it runs again after it."""


def prepare(
    name: str,
    root: str | Path,
    archives: tuple[Archive, ...] | None = None,
    opts: FetchOptions | None = None,
    log: Callable[[str], None] = print,
) -> DataConfig:
    """Make dataset ``name`` (a key of :data:`DATASETS`) under ``root``; returns the checked ``data`` settings.

    Args:
        name: ``voc`` or ``coco``.
        root: The data folder (``data``: the configs read ``data/VOCdevkit/VOC2012`` and ``data/coco``).
        archives: The archives with their addresses and checksums (default: the dataset's official ones).
        opts: Where archives come from, download and disk settings (default: :class:`FetchOptions`'s).
        log: Receives one line per step.

    Raises:
        PrepareError: A step failed; the message is one line naming the file and the fix.
    """
    if name not in DATASETS:
        raise PrepareError(f"unknown dataset {name!r}; choose one of {sorted(DATASETS)}")
    spec = DATASETS[name]
    opts = FetchOptions() if opts is None else opts
    root = Path(root)
    archives = spec.archives if archives is None else archives
    data = DataConfig(**{**spec.data, "root": str(root / spec.data["root"])})
    steps = [_Step(f"unpack {a.name}", _unpack(a, root, root / spec.folder, opts), derived=False) for a in archives]
    steps += _voc_steps(root, data, opts) if name == "voc" else _coco_steps(data, opts)
    steps.append(_Step("check_dataset", _check(data, opts, log), derived=True))
    _run(steps, root / ".prepare" / name, log)
    kept = f"; the archives in {root / 'downloads'} may be deleted" if (root / "downloads").is_dir() else ""
    log(f"ready: data.root = {data.root}{kept}")
    return data


def _run(steps: list[_Step], state: Path, log: Callable[[str], None]) -> None:
    for i, step in enumerate(steps, 1):
        record = state / f"{step.name.replace(' ', '_')}.json"
        if _finished(record):
            log(f"[{i}/{len(steps)}] {step.name}: finished before, skipped")
            continue
        for later in steps[i - 1 :]:  # this step's outputs change: the records of those derived from them go
            if later is step or later.derived:
                (state / f"{later.name.replace(' ', '_')}.json").unlink(missing_ok=True)
        log(f"[{i}/{len(steps)}] {step.name} ...")
        start = time.perf_counter()
        summary, outputs = step.run()
        atomic_write_text(record, json.dumps({"summary": summary, "outputs": [str(p) for p in outputs]}) + "\n")
        log(f"[{i}/{len(steps)}] {step.name}: {summary} ({time.perf_counter() - start:.1f} s)")


def _finished(record: Path) -> bool:
    """The step's record is there, whole, and every output it lists exists (a damaged record: not finished)."""
    value = read_record(record)
    outputs = value.get("outputs") if isinstance(value, dict) else None
    return isinstance(outputs, list) and all(isinstance(p, str) and Path(p).exists() for p in outputs)


def _unpack(archive: Archive, root: Path, dest: Path, opts: FetchOptions) -> Callable[[], tuple[str, list[Path]]]:
    def run() -> tuple[str, list[Path]]:
        path = fetch_archive(archive, root / "downloads", opts, root / ".prepare" / "verified")
        tops = extract_archive(path, dest, opts)
        return f"{path} -> {', '.join(str(dest / t) for t in tops)}", [dest / t for t in tops]

    return run


def _voc_steps(root: Path, data: DataConfig, opts: FetchOptions) -> list[_Step]:
    voc = Path(data.root)

    def sbd() -> tuple[str, list[Path]]:
        counts = _plain(lambda: convert_sbd(root / "benchmark_RELEASE", voc, out_dir=data.mask_dir,
                                            progress=opts.progress))  # fmt: skip
        split = voc / "ImageSets" / "Segmentation" / f"{data.train_split}.txt"
        return f"{counts['sbd']} SBD masks, {counts['voc']} VOC masks, train_aug {counts['train_aug']} ids", [
            voc / data.mask_dir, split]  # fmt: skip

    def labels() -> tuple[str, list[Path]]:
        out = voc / data.label_file
        count, _ = _plain(lambda: make_label_file(voc, "xml", list(data.classes), out, None, data.ignore_index,
                                                  progress=opts.progress))  # fmt: skip
        return f"labels of {count} images from the XML annotations -> {out}", [out]

    return [_Step("convert_sbd", sbd, derived=True), _Step("labels", labels, derived=True)]


def _coco_steps(data: DataConfig, opts: FetchOptions) -> list[_Step]:
    coco = Path(data.root)

    def convert() -> tuple[str, list[Path]]:
        summary = _plain(lambda: convert_coco(coco, None, SPLITS, COCO_VAL_PART, data.ignore_index,
                                              progress=opts.progress))  # fmt: skip
        sizes = ", ".join(f"{k} {v}" for k, v in summary.split_sizes.items())
        outputs = [coco / data.mask_dir, coco / data.label_file, coco / data.classes]
        return f"{summary.written} masks written ({summary.existing} existed), image-level labels; {sizes}", [
            *outputs, *(coco / "ImageSets" / "Segmentation" / f"{s}.txt" for s in summary.split_sizes)]  # fmt: skip

    return [_Step("convert_coco", convert, derived=True)]


def _check(data: DataConfig, opts: FetchOptions, log: Callable[[str], None]) -> Callable[[], tuple[str, list[Path]]]:
    def run() -> tuple[str, list[Path]]:
        problems = _plain(lambda: check_dataset(data, progress=opts.progress))
        for p in problems:
            log(f"{p.path}: {p.reason}")
        if problems:
            raise PrepareError(f"{len(problems)} problem(s) in {data.root} (listed above); delete the folders they "
                               "name and run again to unpack them afresh")  # fmt: skip
        return f"{data.root}: no problems found", []

    return run


def _plain(work: Callable):
    """``work()`` with the one-line errors of the converters and the check turned into :class:`PrepareError`."""
    try:
        return work()
    except (FileNotFoundError, ValueError, ImportError) as err:
        raise PrepareError(str(err)) from None
