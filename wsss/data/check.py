"""Pre-scan of a VOC-layout dataset: every problem that would stop or silently hurt a training run, listed at
once (``tools/check_dataset.py``, and ``data.check_images`` at training start).

Checked: the class list, the label file (entries 0/1, one per foreground class, every training id present),
every image of the train and val splits (exists, is a regular file, decodes), and every mask (present for
val, same size as its image, values in ``[0, C)`` or the ignore index).
"""

from __future__ import annotations

from pathlib import Path

from tqdm import tqdm

from wsss.config import DataConfig
from wsss.data.classes import load_classes
from wsss.data.folder import Skipped
from wsss.data.labels import check_mask_values, load_labels, under_root
from wsss.data.voc import find_image, read_split, resolve_root, resolve_split
from wsss.utils.fileio import read_image, read_mask

__all__ = ["check_dataset"]


def check_dataset(cfg: DataConfig, progress: bool = True) -> list[Skipped]:
    """Every problem of the dataset ``cfg`` describes, as (file or id, reason); empty when it is sound.

    Raises:
        FileNotFoundError: The root, its image folder or the class file is missing (nothing else can be checked).
        ValueError: The set is not in the VOC layout.
    """
    if cfg.layout != "voc":
        raise ValueError(f"check_dataset reads VOC-layout sets; data.layout is {cfg.layout!r}")
    root = resolve_root(cfg.root, cfg.image_dir)
    classes = load_classes(under_root(root, cfg.classes) if isinstance(cfg.classes, str) else cfg.classes)
    problems: list[Skipped] = []
    label_path = under_root(root, cfg.label_file)
    try:
        labels = load_labels(label_path, classes)
    except (FileNotFoundError, ValueError) as err:
        problems.append(Skipped(str(label_path), str(err)))
        labels = None
    for split, is_train in ((cfg.train_split, True), (cfg.val_split, False)):
        try:
            ids = read_split(resolve_split(root, split))
        except (FileNotFoundError, ValueError) as err:
            problems.append(Skipped(split, str(err)))
            continue
        for image_id in tqdm(ids, desc=f"check {split}", unit="img", disable=not progress, leave=False):
            if is_train and labels is not None and image_id not in labels:
                problems.append(Skipped(image_id, f"no entry in {label_path}"))
            problem = _check_pair(root, cfg, image_id, len(classes), mask_required=not is_train)
            if problem is not None:
                problems.append(problem)
    return problems


def _check_pair(root: Path, cfg: DataConfig, image_id: str, num_classes: int, mask_required: bool) -> Skipped | None:
    image_path = find_image(root, image_id, cfg.image_dir)
    if image_path is None:
        return Skipped(image_id, f"no image in {root / cfg.image_dir}")
    mask_path = root / cfg.mask_dir / f"{image_id}.png"
    try:
        image = read_image(image_path)
        if not mask_path.is_file():
            return Skipped(str(mask_path), "mask missing") if mask_required else None
        mask = read_mask(mask_path)
        if mask.shape != image.shape[:2]:
            return Skipped(str(mask_path), f"mask is {mask.shape[::-1]}, its image {image.shape[1::-1]} (W, H)")
        check_mask_values(mask, num_classes, cfg.ignore_index, mask_path)
    except ValueError as err:
        path, _, reason = str(err).partition(": ")
        return Skipped(path, reason)
    return None
