"""PASCAL VOC-layout datasets: classification crops for training, full images + masks for evaluation.

Layout (any dataset with its own class list works the same way; ``data.image_dir`` names the image folder and
ids may be nested paths, with or without the image extension)::

    ROOT/JPEGImages/<id>.jpg
    ROOT/<mask_dir>/<id>.png             palette or gray index PNG, 255 = ignore
    ROOT/ImageSets/Segmentation/<split>.txt
    ROOT/<label_file>                    written by tools/make_cls_labels.py

With ``data.layout="tags"`` the label file is a hand-written tags file (:mod:`wsss.data.tags`), the splits
``train`` and ``val`` are a fixed partition of its images, and nothing needs a mask.
"""

from __future__ import annotations

import sys
import zlib
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from wsss.config import DataConfig, check_ignore_index
from wsss.data.classes import load_classes
from wsss.data.labels import check_mask_values, load_labels, under_root
from wsss.data.paths import UnsafePathError, confined, line_of, safe_relative
from wsss.data.tags import hash_split, read_tags, require_a_tag, tag_classes, tag_labels
from wsss.data.transforms import PixelNormalize, TrainAugment, normalize
from wsss.utils.fileio import IMAGE_EXTENSIONS, read_image, read_mask

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


def resolve_split(root: Path, split: str) -> Path:
    """A split name (``ImageSets/Segmentation/<split>.txt`` under ``root``) or a path to a split file."""
    path = Path(split)
    if path.suffix == ".txt" or len(path.parts) > 1:
        return path if path.is_absolute() or path.is_file() else root / path
    return root / "ImageSets" / "Segmentation" / f"{split}.txt"


def read_split(path: Path) -> list[str]:
    """Image ids of a split file, one per line (extra columns ignored).

    Raises:
        FileNotFoundError: The file is missing (the message names it and the config key to fix).
        ValueError: The file is empty.
    """
    if not path.is_file():
        raise FileNotFoundError(
            f"split file not found: {path}. Create it (one image id per line) or set "
            "data.train_split / data.val_split to an existing split name or file."
        )
    ids = [line.split()[0] for line in path.read_text().splitlines() if line.strip()]
    if not ids:
        raise ValueError(f"split file {path} lists no image ids")
    return ids


def find_image(root: Path, image_id: str, image_dir: str) -> Path | None:
    """``root/<image_dir>/<image_id>``, as given when it ends in an image extension, else with the first of
    :data:`IMAGE_SUFFIXES` that exists; None if none does. Any kind of file counts (reading a named pipe then
    fails with its reason rather than "no image")."""
    base = root / image_dir
    if Path(image_id).suffix.lower() in IMAGE_EXTENSIONS and (base / image_id).exists():
        return base / image_id
    for ext in IMAGE_SUFFIXES:
        path = base / f"{image_id}{ext}"
        if path.exists():
            return path
    return None


def confined_ids(ids: list[str], source: Path, base: Path) -> list[str]:
    """``ids`` (listed in ``source``) as clean relative paths (:func:`wsss.data.paths.safe_relative`).

    Raises:
        UnsafePathError: Some id is absolute, empty or climbs with ``..``; the message names the file and line of
            the first few.
    """
    unsafe = [i for i in ids if safe_relative(i) is None]
    if unsafe:
        where = ", ".join(f"{source}:{line_of(source, i) or '?'} {i!r}" for i in unsafe[:3])
        raise UnsafePathError(
            f"{len(unsafe)} id(s) absolute, empty or climbing with '..' ({where}); an id is a path relative to "
            f"{base}: fix or remove those lines"
        )
    return [safe_relative(i) for i in ids]


def image_file(root: Path, image_id: str, cfg: DataConfig) -> Path | None:
    """The image of a clean ``image_id`` (see :func:`confined_ids`) under ``root/cfg.image_dir``, None if there is
    none.

    Raises:
        UnsafePathError: It resolves outside ``root`` and ``cfg.follow_symlinks`` does not allow it.
    """
    path = find_image(root, image_id, cfg.image_dir)
    return None if path is None else confined(path, root, cfg.follow_symlinks, "data.follow_symlinks=True")


def mask_file(root: Path, image_id: str, cfg: DataConfig) -> Path:
    """``root/cfg.mask_dir/<image_id without its image extension>.png`` (it may not exist).

    Raises:
        UnsafePathError: It resolves outside ``root`` and ``cfg.follow_symlinks`` does not allow it.
    """
    suffix = Path(image_id).suffix
    stem = image_id[: -len(suffix)] if suffix.lower() in IMAGE_EXTENSIONS else image_id
    return confined(root / cfg.mask_dir / f"{stem}.png", root, cfg.follow_symlinks, "data.follow_symlinks=True")


def resolve_root(root: str | Path, image_dir: str = "JPEGImages") -> Path:
    """Check the dataset root and its image folder exist."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(
            f"dataset root not found: {root}. Set data.root to the folder holding {image_dir}/ "
            "(see data/README.md), or run `python tools/make_toy_voc.py` for the toy dataset."
        )
    if not (root / image_dir).is_dir():
        raise FileNotFoundError(
            f"{root} has no {image_dir}/ folder; data.root must hold the images in data.image_dir ({image_dir})"
        )
    return root


def config_classes(cfg: DataConfig) -> list[str]:
    """The class names ``data.classes`` gives: a list, or a file (see :func:`wsss.data.labels.under_root`)."""
    if cfg.classes is None:
        raise ValueError("data.classes is unset: give the class list (only the tags layout reads it from its file)")
    return load_classes(under_root(cfg.root, cfg.classes) if isinstance(cfg.classes, str) else cfg.classes)


class _VOCBase(Dataset):
    def __init__(self, cfg: DataConfig, split: str):
        self.cfg = cfg
        self.root = resolve_root(cfg.root, cfg.image_dir)
        self.tags = None
        if cfg.layout == "tags":
            tags_file = self._resolve(cfg.label_file)
            tags = read_tags(tags_file, lambda image_id: find_image(self.root, image_id, cfg.image_dir))
            require_a_tag(tags, tags_file)
            ids = confined_ids(list(tags), tags_file, self.root / cfg.image_dir)
            self.tags = dict(zip(ids, tags.values(), strict=True))
        if cfg.classes is None and self.tags is not None:
            self.classes = tag_classes(self.tags)
        else:
            self.classes = config_classes(cfg)
        check_ignore_index(cfg.ignore_index, len(self.classes))  # the config checks it when it lists the classes
        if self.tags is not None and split in ("train", "val"):
            self.split_file = self._resolve(cfg.label_file)
            self.ids = hash_split(sorted(self.tags), cfg.val_fraction)[split == "val"]
            if not self.ids:
                raise ValueError(
                    f"{self.split_file}: no image falls in the '{split}' part at data.val_fraction="
                    f"{cfg.val_fraction}; tag more images or change data.val_fraction"
                )
        else:
            self.split_file = resolve_split(self.root, split)
            self.ids = confined_ids(read_split(self.split_file), self.split_file, self.root / cfg.image_dir)
        self._images = {i: image_file(self.root, i, cfg) for i in self.ids}
        missing = [i for i, path in self._images.items() if path is None]
        if missing:
            raise FileNotFoundError(
                f"{len(missing)} id(s) in {self.split_file} have no image in {self.root / cfg.image_dir} "
                f"(first: {missing[:3]}). Remove them from the split file or add the images."
            )

    def _resolve(self, name: str) -> Path:
        return under_root(self.root, name)

    def image_path(self, image_id: str) -> Path:
        return self._images[image_id]

    def mask_path(self, image_id: str) -> Path:
        return mask_file(self.root, image_id, self.cfg)

    def require_masks(self) -> None:
        """Raise FileNotFoundError naming the split, the folder and the fix unless every id has a mask."""
        missing = [i for i in self.ids if not self.mask_path(i).is_file()]
        if missing:
            raise FileNotFoundError(
                f"{len(missing)} id(s) in {self.split_file} have no mask in {self.root / self.cfg.mask_dir} "
                f"(first: {missing[:3]}). Set data.mask_dir to the folder holding the masks."
            )

    def load_mask(self, image_id: str, shape: tuple[int, ...]) -> np.ndarray:
        """Read and check the mask of ``image_id`` against its image's (H, W) and the class count."""
        path = self.mask_path(image_id)
        mask = read_mask(path)
        if mask.shape != tuple(shape):
            raise ValueError(
                f"{path}: mask is {mask.shape[1]}x{mask.shape[0]} but image {self.image_path(image_id)} "
                f"is {shape[1]}x{shape[0]} (width x height); the mask must match its image."
            )
        check_mask_values(mask, len(self.classes), self.cfg.ignore_index, path)
        return mask

    def load_image_labels(self) -> dict[str, np.ndarray]:
        """Image-level labels: from the tags file, or from the label file of tools/make_cls_labels.py."""
        path = self._resolve(self.cfg.label_file)
        if self.tags is not None:
            labels = tag_labels(self.tags, self.classes, path)
        else:
            labels = {safe_relative(k) or k: v for k, v in load_labels(path, self.classes).items()}
        unlabelled = [i for i in self.ids if i not in labels]
        if unlabelled:
            raise ValueError(
                f"{len(unlabelled)} id(s) of {self.split_file} are missing from {self.cfg.label_file} "
                f"(first: {unlabelled[:3]}); regenerate it with tools/make_cls_labels.py"
            )
        return labels

    def __len__(self) -> int:
        return len(self.ids)


class VOCClsDataset(_VOCBase):
    """Training crops with image-level labels.

    Each item is a dict: ``image`` (3, crop, crop) uint8, the crop's pixels (:meth:`normalize`, on the device, makes
    the model's input of them, bit for bit what the augmentation's own normalisation gives on the host, from a
    quarter of the bytes through the loader), ``label`` (C-1,) float32 multi-hot,
    ``box`` (4,) int64 ``[y0, y1, x0, x1]`` valid region, ``id``; with ``with_mask`` also ``mask``
    (crop, crop) int64 (for scoring pseudo labels, never as WSSS supervision; classification pre-training with
    ``pretrain.labels = "crop"`` takes its targets from it).

    Augmentation is a pure function of ``(seed, epoch, index)``: set :attr:`epoch` each epoch and a
    resumed run sees exactly the crops an uninterrupted one would.

    An image that fails to decode is skipped with a warning on stderr naming it: the next readable image of
    the split takes its place (the same one every time), and its item's ``skipped`` holds the warning (``""``
    for none), so that a loader worker's warning reaches the training log. More than ``cfg.max_bad_images``
    unreadable images in one process raise ValueError.
    """

    def __init__(
        self,
        cfg: DataConfig,
        mean: tuple[float, ...],
        std: tuple[float, ...],
        split: str | None = None,
        seed: int = 0,
        with_mask: bool = False,
    ):
        super().__init__(cfg, cfg.train_split if split is None else split)
        self.label_path = self._resolve(cfg.label_file)
        self.labels = self.load_image_labels()
        self.augment = TrainAugment(cfg, mean, std)
        self.mean, self.std = mean, std
        self.seed = seed
        self.epoch = 0
        self.with_mask = with_mask
        if with_mask:
            self.require_masks()
        self.bad: set[Path] = set()

    def __getitem__(self, index: int) -> dict:
        image_id, image, skipped = self._readable(index)
        mask = self.load_mask(image_id, image.shape[:2]) if self.with_mask else None
        seed = zlib.crc32(f"{self.seed}:{self.epoch}:{index}".encode())
        sample = self.augment.pixels(image, mask, seed)
        item = {
            "id": image_id,
            "image": torch.from_numpy(sample.image).permute(2, 0, 1).contiguous(),
            "label": torch.from_numpy(self.labels[image_id].astype(np.float32)),
            "box": torch.from_numpy(sample.box),
            "skipped": skipped,
        }
        if self.with_mask:
            item["mask"] = torch.from_numpy(sample.mask.astype(np.int64))
        return item

    def normalize(self, device: torch.device | str = "cpu") -> PixelNormalize:
        """What makes the model's input of a batch's ``image`` on ``device``."""
        return PixelNormalize(self.mean, self.std, device)

    def _readable(self, index: int) -> tuple[str, np.ndarray, str]:
        """The id and decoded image at ``index``, or at the next index whose image decodes, and the warnings
        about the images passed over, one per line."""
        warnings = []
        for step in range(len(self.ids)):
            image_id = self.ids[(index + step) % len(self.ids)]
            path = self.image_path(image_id)
            if path in self.bad:
                continue
            try:
                return image_id, read_image(path, self.cfg.max_image_pixels), "\n".join(warnings)
            except ValueError as err:
                self.bad.add(path)
                warnings.append(f"warning: skipping training image {err}")
                print(warnings[-1], file=sys.stderr)
                if len(self.bad) > self.cfg.max_bad_images:
                    raise ValueError(
                        f"{len(self.bad)} training images could not be read (more than data.max_bad_images = "
                        f"{self.cfg.max_bad_images}), the last: {err}. Run tools/check_dataset.py to list them."
                    ) from None
        raise ValueError(f"no image of {self.split_file} can be read; run tools/check_dataset.py")


class VOCSegDataset(_VOCBase):
    """Full-size images with their masks, for evaluation.

    Each item is a dict: ``image`` (3, H, W) float32 normalised, ``raw`` (H, W, 3) uint8 RGB,
    ``mask`` (H, W) int64, ``id``. Sizes differ between images: use batch size 1 or :func:`collate_list`.
    """

    def __init__(self, cfg: DataConfig, mean: tuple[float, ...], std: tuple[float, ...], split: str | None = None):
        super().__init__(cfg, cfg.val_split if split is None else split)
        self.mean, self.std = mean, std
        self.require_masks()

    def __getitem__(self, index: int) -> dict:
        image_id = self.ids[index]
        raw = read_image(self.image_path(image_id), self.cfg.max_image_pixels)
        mask = self.load_mask(image_id, raw.shape[:2])
        return {
            "id": image_id,
            "image": normalize(raw, self.mean, self.std),
            "raw": raw,
            "mask": torch.from_numpy(mask.astype(np.int64)),
        }


class TaggedValDataset(_VOCBase):
    """Full-size images with their image-level labels and no mask, for validating a tag-only dataset.

    Each item is a dict: ``image`` (3, H, W) float32 normalised, ``raw`` (H, W, 3) uint8 RGB, ``label`` (C-1,)
    float32 multi-hot, ``id``.
    """

    def __init__(self, cfg: DataConfig, mean: tuple[float, ...], std: tuple[float, ...], split: str | None = None):
        super().__init__(cfg, cfg.val_split if split is None else split)
        self.mean, self.std = mean, std
        self.labels = self.load_image_labels()

    def __getitem__(self, index: int) -> dict:
        image_id = self.ids[index]
        raw = read_image(self.image_path(image_id), self.cfg.max_image_pixels)
        return {
            "id": image_id,
            "image": normalize(raw, self.mean, self.std),
            "raw": raw,
            "label": torch.from_numpy(self.labels[image_id].astype(np.float32)),
        }


def val_dataset(cfg: DataConfig, mean: tuple[float, ...], std: tuple[float, ...]) -> VOCSegDataset | TaggedValDataset:
    """The validation set: images with masks, or with tags only when ``cfg.layout == "tags"``."""
    return TaggedValDataset(cfg, mean, std) if cfg.layout == "tags" else VOCSegDataset(cfg, mean, std)


class SkipUnreadable(Dataset):
    """The items of ``dataset``; an item whose image or mask cannot be read (the ValueError names the file)
    becomes ``{"id": ..., "skipped": reason}``, which a loader worker hands to the main process as one line (a
    worker's own exception would come with its traceback)."""

    def __init__(self, dataset: VOCSegDataset | TaggedValDataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict:
        try:
            return self.dataset[index]
        except ValueError as err:
            return {"id": self.dataset.ids[index], "skipped": str(err)}


def collate_list(items: list[dict]) -> dict:
    """Collate dicts of differently sized items into a dict of lists."""
    return {key: [item[key] for item in items] for key in items[0]}
