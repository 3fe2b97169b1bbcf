"""Pre-scan of a dataset, every layout: every problem that would stop or silently hurt a training run, listed at
once (``tools/check_dataset.py``, and ``data.check_images`` at training start).

Checked, for the VOC layout (PASCAL VOC, and COCO as ``tools/convert_coco.py`` writes it): the class list, the
label file (entries 0/1, one per foreground class, every training id present), every id of the train and val
splits (a plain relative path: not absolute, no ``..``; see :mod:`wsss.data.paths`), every image (exists,
inside the root, a regular file, decodes, within ``data.max_image_pixels``) and every mask (present for val,
inside the root, same size as its image, values in ``[0, C)`` or the ignore index). For the tags layout: the
tags file (readable, one entry per image file, a tag on some image, its classes those of ``data.classes`` when
given), its ids, both parts of its split non-empty and every image as above; there are no masks.
"""

from __future__ import annotations

from pathlib import Path

from tqdm import tqdm

from wsss.config import DataConfig
from wsss.data.classes import load_classes
from wsss.data.folder import Skipped
from wsss.data.labels import check_mask_values, load_labels, under_root
from wsss.data.paths import UnsafePathError, line_of, safe_relative
from wsss.data.tags import hash_split, read_tags, require_a_tag, tag_classes, tag_labels
from wsss.data.voc import find_image, image_file, mask_file, read_split, resolve_root, resolve_split
from wsss.utils.fileio import read_image, read_mask

__all__ = ["check_dataset"]


def check_dataset(cfg: DataConfig, progress: bool = True) -> list[Skipped]:
    """Every problem of the dataset ``cfg`` describes, as (file or id, reason); empty when it is sound.

    Raises:
        FileNotFoundError: The root, its image folder or the class file is missing (nothing else can be checked).
    """
    root = resolve_root(cfg.root, cfg.image_dir)
    problems: list[Skipped] = []
    splits = _tag_splits(root, cfg, problems) if cfg.layout == "tags" else _voc_splits(root, cfg, problems)
    num_classes = 0 if cfg.layout == "tags" else len(_classes(root, cfg))
    for name, ids, mask_required in splits:
        for image_id in tqdm(ids, desc=f"check {name}", unit="img", disable=not progress, leave=False):
            problem = _check_pair(root, cfg, image_id, num_classes, mask_required)
            if problem is not None:
                problems.append(problem)
    return problems


def _voc_splits(root: Path, cfg: DataConfig, problems: list[Skipped]) -> list[tuple[str, list[str], bool]]:
    """The clean ids of the train and val split files (unsafe ids and label-file gaps go to ``problems``)."""
    classes = _classes(root, cfg)
    label_path = under_root(root, cfg.label_file)
    try:
        labels = {safe_relative(k) or k: v for k, v in load_labels(label_path, classes).items()}
    except (FileNotFoundError, ValueError) as err:
        problems.append(Skipped(str(label_path), str(err)))
        labels = None
    splits = []
    for split, is_train in ((cfg.train_split, True), (cfg.val_split, False)):
        split_file = resolve_split(root, split)
        try:
            ids = _clean_ids(read_split(split_file), split_file, root / cfg.image_dir, problems)
        except (FileNotFoundError, ValueError) as err:
            problems.append(Skipped(split, str(err)))
            continue
        if is_train and labels is not None:
            problems += [Skipped(i, f"no entry in {label_path}") for i in ids if i not in labels]
        splits.append((split, ids, not is_train))
    return splits


def _tag_splits(root: Path, cfg: DataConfig, problems: list[Skipped]) -> list[tuple[str, list[str], bool]]:
    """The clean ids of the two parts of the tags file (its problems go to ``problems``)."""
    tags_file = under_root(root, cfg.label_file)
    try:
        tags = read_tags(tags_file, lambda image_id: find_image(root, image_id, cfg.image_dir))
        ids = _clean_ids(list(tags), tags_file, root / cfg.image_dir, problems)
        tags = {safe_relative(k): v for k, v in tags.items() if safe_relative(k) is not None}
        tag_labels(tags, tag_classes(tags) if cfg.classes is None else _classes(root, cfg), tags_file)
        require_a_tag(tags, tags_file)
    except (FileNotFoundError, ValueError) as err:
        problems.append(_located(str(err), tags_file))
        return []
    train, val = hash_split(sorted(ids), cfg.val_fraction)
    for name, part in (("train", train), ("val", val)):
        if not part:
            reason = f"no image falls in the '{name}' part at data.val_fraction={cfg.val_fraction}"
            problems.append(Skipped(str(tags_file), reason))
    return [("train", train, False), ("val", val, False)]


def _located(message: str, file: Path) -> Skipped:
    """A problem of ``file`` from an error message: ``FILE line N: reason`` as (``FILE:N``, reason), ``FILE:
    reason`` as (``FILE``, reason)."""
    where, _, reason = message.partition(": ")
    line = where.removeprefix(f"{file} line ")
    if line.isdigit():
        return Skipped(f"{file}:{line}", reason)
    return Skipped(str(file), reason if where == str(file) else message)


def _classes(root: Path, cfg: DataConfig) -> list[str]:
    return load_classes(under_root(root, cfg.classes) if isinstance(cfg.classes, str) else cfg.classes)


def _clean_ids(ids: list[str], source: Path, base: Path, problems: list[Skipped]) -> list[str]:
    """The ids of ``source`` that are plain relative paths, cleaned; one problem per other id, with its line."""
    clean = []
    for image_id in ids:
        rel = safe_relative(image_id)
        if rel is None:
            reason = f"id {image_id!r} is absolute, empty or climbs with '..'; ids are paths relative to {base}"
            problems.append(Skipped(f"{source}:{line_of(source, image_id) or '?'}", reason))
        else:
            clean.append(rel)
    return clean


def _check_pair(root: Path, cfg: DataConfig, image_id: str, num_classes: int, mask_required: bool) -> Skipped | None:
    try:
        image_path = image_file(root, image_id, cfg)
        if image_path is None:
            return Skipped(image_id, f"no image in {root / cfg.image_dir}")
        image = read_image(image_path, cfg.max_image_pixels)
        if cfg.layout == "tags":
            return None
        mask_path = mask_file(root, image_id, cfg)
        if not mask_path.is_file():
            return Skipped(str(mask_path), "mask missing") if mask_required else None
        mask = read_mask(mask_path)
        if mask.shape != image.shape[:2]:
            return Skipped(str(mask_path), f"mask is {mask.shape[::-1]}, its image {image.shape[1::-1]} (W, H)")
        check_mask_values(mask, num_classes, cfg.ignore_index, mask_path)
    except UnsafePathError as err:
        return Skipped(image_id, str(err))
    except ValueError as err:
        path, _, reason = str(err).partition(": ")
        return Skipped(path, reason)
    return None
