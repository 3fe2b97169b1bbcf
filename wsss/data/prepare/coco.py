"""MS COCO 2014 instance annotations -> the VOC-style layout the pipeline reads (tools/convert_coco.py).

Given ``ROOT/annotations/instances_{train,val}2014.json`` and the images in ``ROOT/{train,val}2014/``, it
writes, under ROOT::

    SegmentationClass/<split>2014/<stem>.png   index PNG: 0 background, 1..80 the categories by id order
    ImageSets/Segmentation/{train,val,val_part}.txt   ids ``<split>2014/<stem>``
    cls_labels.json                            image-level labels (:func:`wsss.data.labels.save_labels`)
    classes.txt                                background + the 80 category names

The overlap rule (:func:`semantic_mask`): a pixel takes class ``c`` when every instance covering it is a
non-crowd instance of ``c``; it is ``ignore_index`` (255) where instances of two or more classes overlap or
where a crowd region (``iscrowd=1``) covers it; it is background (0) elsewhere. The image-level label of an
image lists every category annotated in it, crowd regions included. As in ToCo's released lists (82,081
train and 40,137 val ids), the split files hold only images with at least one annotation; ``val_part`` is the
first ``val_part`` ids of the sorted val list (ToCo's 5,000-image validation subset).

Memory stays bounded: one image's masks exist at a time, and only the annotation index (pycocotools) is
held. An interrupted conversion resumes: a mask that exists is not decoded again.
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from wsss.data.labels import load_labels, multi_hot, save_labels
from wsss.utils.fileio import atomic_write_text, save_mask

SPLITS = ("train", "val")
"""COCO 2014 subsets; images in ``ROOT/<split>2014/``, annotations in ``instances_<split>2014.json``."""

__all__ = ["CocoSummary", "convert_coco", "semantic_mask"]


def _coco_api():
    try:
        from pycocotools import mask as mask_utils
        from pycocotools.coco import COCO
    except ImportError as err:
        raise ImportError("converting COCO needs the 'pycocotools' package: pip install pycocotools") from err
    return COCO, mask_utils


def semantic_mask(
    anns: list[dict], height: int, width: int, cat_index: dict[int, int], ignore_index: int
) -> np.ndarray:
    """The (H, W) uint8 semantic mask of one image from its COCO annotations (polygons or RLE).

    Args:
        anns: The image's annotations (``segmentation``, ``category_id``, ``iscrowd``).
        height: Image height.
        width: Image width.
        cat_index: COCO category id -> class index (1-based; 0 is background).
        ignore_index: Value of overlaps between classes and of crowd regions.
    """
    _, mask_utils = _coco_api()
    label = np.zeros((height, width), dtype=np.uint8)
    conflict = np.zeros((height, width), dtype=bool)
    crowd = np.zeros((height, width), dtype=bool)
    for ann in anns:
        region = _decode(ann["segmentation"], height, width, mask_utils)
        if ann.get("iscrowd", 0):
            crowd |= region
            continue
        c = cat_index[ann["category_id"]]
        conflict |= region & (label != 0) & (label != c)
        label[region] = c
    label[conflict | crowd] = ignore_index
    return label


def _decode(segmentation, height: int, width: int, mask_utils) -> np.ndarray:
    """(H, W) bool mask of a polygon list, an uncompressed RLE (counts as a list) or a compressed RLE."""
    if isinstance(segmentation, list):
        rle = mask_utils.merge(mask_utils.frPyObjects(segmentation, height, width))
    elif isinstance(segmentation.get("counts"), list):
        rle = mask_utils.frPyObjects(segmentation, height, width)
    else:
        rle = segmentation
    return mask_utils.decode(rle).astype(bool)


@dataclass
class CocoSummary:
    """What :func:`convert_coco` did: ids per split file, masks written now and kept from before."""

    split_sizes: dict[str, int]
    written: int
    existing: int


def convert_coco(
    root: str | Path,
    ann_dir: str | Path | None,
    splits: tuple[str, ...],
    val_part: int,
    ignore_index: int,
    overwrite: bool = False,
    progress: bool = True,
) -> CocoSummary:
    """Write masks, split files, labels and the class list of COCO 2014 under ``root`` (layout above).

    Args:
        root: Holds ``<split>2014/`` images; outputs go here.
        ann_dir: Folder of ``instances_<split>2014.json`` (default ``root/annotations``).
        splits: Which of ``train`` and ``val`` to convert.
        val_part: Length of the ``val_part`` split (0: not written).
        ignore_index: Value of class overlaps and crowd regions.
        overwrite: Decode again masks that exist.
        progress: Show a progress bar per split.

    Raises:
        FileNotFoundError: An annotation file is missing (the message names it).
        ImportError: pycocotools is not installed.
    """
    coco_cls, _ = _coco_api()
    root = Path(root)
    ann_dir = Path(ann_dir) if ann_dir is not None else root / "annotations"
    classes, labels, sizes = None, {}, {}
    written = existing = 0
    for split in splits:
        ann_file = ann_dir / f"instances_{split}2014.json"
        if not ann_file.is_file():
            raise FileNotFoundError(
                f"{ann_file} not found; download annotations_trainval2014.zip from cocodataset.org and unzip it "
                f"into {ann_dir}, or pass --ann-dir"
            )
        with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints "loading annotations into memory..."
            coco = coco_cls(str(ann_file))
        cats = sorted(coco.loadCats(coco.getCatIds()), key=lambda c: c["id"])
        names = ["background"] + [c["name"] for c in cats]
        if classes is not None and names != classes:
            raise ValueError(f"{ann_file}: its categories differ from those of the other split")
        classes = names
        cat_index = {c["id"]: i + 1 for i, c in enumerate(cats)}
        ids = []
        for image_id in tqdm(sorted(coco.getImgIds()), desc=f"coco {split}", unit="img", disable=not progress):
            info = coco.imgs[image_id]
            anns = coco.imgToAnns.get(image_id, [])
            if not anns:
                continue
            key = f"{split}2014/{Path(info['file_name']).stem}"
            ids.append(key)
            labels[key] = multi_hot(sorted({cat_index[a["category_id"]] - 1 for a in anns}), len(cats))
            path = root / "SegmentationClass" / f"{key}.png"
            if path.is_file() and not overwrite:
                existing += 1
                continue
            save_mask(path, semantic_mask(anns, info["height"], info["width"], cat_index, ignore_index))
            written += 1
        del coco
        sets = {split: ids}
        if split == "val" and val_part:
            sets["val_part"] = ids[:val_part]
        for name, listed in sets.items():
            atomic_write_text(root / "ImageSets" / "Segmentation" / f"{name}.txt", "".join(f"{i}\n" for i in listed))
            sizes[name] = len(listed)
    atomic_write_text(root / "classes.txt", "".join(f"{n}\n" for n in classes))
    label_file = root / "cls_labels.json"
    if label_file.is_file():  # keep the labels of a split converted in an earlier run
        labels = {**load_labels(label_file, classes), **labels}
    save_labels(label_file, labels, classes)
    return CocoSummary(split_sizes=sizes, written=written, existing=existing)
