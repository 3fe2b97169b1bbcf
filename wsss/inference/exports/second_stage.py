"""The configs that train a fully supervised segmenter on exported pseudo labels
(:mod:`wsss.inference.exports.pseudo_labels`).

Two mmseg config files go beside the masks::

    OUT/mmseg_dataset.py   the dataset snippet: data_root, BaseSegDataset with img_path, seg_map_path (the
                           dual-threshold masks), ann_file (the exported ids), reduce_zero_label=False,
                           ignore_index=255, the classes and their VOC palette
    OUT/mmseg_train.py     ready to edit: mmseg's DeepLabV3+ ResNet-101 VOC-aug config with its train set replaced
                           by the snippet's, its val set by the dataset's val split and masks, num_classes set

There is no wsss config among them: ``tools/train.py`` learns from image-level labels only. Its segmentation loss
takes as targets the pseudo labels the model makes from its own CAMs at every step
(:func:`wsss.engine.step.pseudo_label_targets`), and no ``loss.*`` key makes it read masks from disk (the ``loss``
keys weight the terms and time the dense ones; the classification term, weight 1, needs the image labels), so no
setting of ours trains on these masks. The second stage is a fully supervised segmenter, mmseg's.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

from wsss.config import Config
from wsss.data.classes import voc_palette
from wsss.data.voc import resolve_split
from wsss.utils.fileio import atomic_write_text

MMSEG_BASE = "mmseg::deeplabv3plus/deeplabv3plus_r101-d8_4xb4-40k_voc12aug-512x512.py"
"""The mmseg config ``mmseg_train.py`` inherits: a DeepLab on VOC aug, the usual second stage of the WSSS literature."""

WHY_NOT_OURS = """\
# Why no wsss config: tools/train.py learns from image-level labels only. Its segmentation loss takes as targets the
# pseudo labels the model makes from its own CAMs at every step (wsss/engine/step.py, pseudo_label_targets), and no
# loss.* key makes it read masks from disk (those keys weight the terms and time the dense ones; the classification
# term needs the image labels), so no setting of ours trains on these masks: the second stage is mmseg's.
"""


def _dataset_keys(
    img_path: str, seg_map_path: str, ann_file: str, img_suffix: str, ignore_index: int, indent: str
) -> str:
    """The keyword lines of a BaseSegDataset ``dict(...)``, one per line (``data_root`` and ``metainfo`` are variables
    of the file)."""
    lines = [
        "type='BaseSegDataset',", "data_root=data_root,",
        f"data_prefix=dict(img_path={img_path!r}, seg_map_path={seg_map_path!r}),", f"ann_file={ann_file!r},",
        f"img_suffix={img_suffix!r},", "seg_map_suffix='.png',", "reduce_zero_label=False,",
        f"ignore_index={ignore_index},", "metainfo=metainfo,",
    ]  # fmt: skip
    return "\n".join(indent + line for line in lines)


def _metainfo(classes: list[str]) -> str:
    palette = [list(map(int, c)) for c in voc_palette()[: len(classes)]]
    return f"metainfo = dict(\n    classes={tuple(classes)!r},\n    palette={palette!r},\n)\n"


def write_second_stage(
    output: Path,
    cfg: Config,
    root: Path,
    split_file: Path,
    seg_map_dir: Path,
    image_suffixes: list[str],
    classes: list[str],
    header: str,
) -> dict[str, Path]:
    """Write ``mmseg_dataset.py`` and ``mmseg_train.py`` under ``output``.

    Args:
        output: OUT.
        cfg: The export's config (``data.image_dir``, ``data.layout``, ``data.val_split``, ``data.mask_dir``).
        root: The dataset root (the images).
        split_file: The exported ids, one per line without extension.
        seg_map_dir: The dual-threshold masks.
        image_suffixes: The extension of each exported image (mmseg reads one ``img_suffix``: the most common).
        classes: Class names, background first.
        header: First comment lines (what was exported, from what).

    Returns:
        ``{"mmseg_dataset": path, "mmseg_train": path}``.
    """
    counts = Counter(image_suffixes)
    suffix = counts.most_common(1)[0][0] if counts else ".jpg"
    odd = sum(n for s, n in counts.items() if s != suffix)
    note = (
        f"# {odd} exported images have another extension than {suffix!r}: mmseg reads one img_suffix, convert them.\n"
        if odd
        else ""
    )
    data_root = os.path.realpath(root)
    train_keys = dict(
        img_path=cfg.data.image_dir, seg_map_path=os.path.realpath(seg_map_dir), ann_file=os.path.realpath(split_file),
        img_suffix=suffix, ignore_index=cfg.data.ignore_index,
    )  # fmt: skip
    comment = "".join(f"# {line}\n" for line in header.splitlines())
    snippet = (
        f"{comment}# The masks are palette PNGs of class indices, {cfg.data.ignore_index} = uncertain (mmseg's "
        "ignore_index: no loss there).\n# Use pseudo_label_dataset as the train dataset of an mmseg config (add its "
        "pipeline), as mmseg_train.py does.\n"
        f"{note}data_root = {data_root!r}\n{_metainfo(classes)}"
        f"pseudo_label_dataset = dict(\n{_dataset_keys(**train_keys, indent='    ')}\n)\n"
    )
    if cfg.data.layout == "voc":
        val_keys = dict(
            img_path=cfg.data.image_dir, seg_map_path=cfg.data.mask_dir, img_suffix=suffix,
            ann_file=os.path.realpath(resolve_split(root, cfg.data.val_split)), ignore_index=cfg.data.ignore_index,
        )  # fmt: skip
        val = (
            "# Validation: the dataset's val split and its ground-truth masks.\n"
            f"val_dataloader = dict(\n    dataset=dict(\n{_dataset_keys(**val_keys, indent=' ' * 8)}\n    ),\n)\n"
            "test_dataloader = val_dataloader\n"
        )
    else:
        val = (
            "# No validation: a tags-layout dataset has no masks. Give a val_dataloader with masks to validate.\n"
            "val_dataloader = val_cfg = val_evaluator = None\ntest_dataloader = test_cfg = test_evaluator = None\n"
        )
    train = (
        f"{comment}# Ready to edit: a fully supervised segmenter trained on these pseudo labels (255 = uncertain, "
        "ignored by the loss).\n# Train with mmseg's tools/train.py (needs full mmcv with its ops, see the README).\n"
        f"{WHY_NOT_OURS}{note}_base_ = [{MMSEG_BASE!r}]\n"
        f"data_root = {data_root!r}\n{_metainfo(classes)}"
        f"model = dict(decode_head=dict(num_classes={len(classes)}), auxiliary_head=dict(num_classes={len(classes)}))\n"
        "train_dataloader = dict(\n    dataset=dict(\n        _delete_=True,\n"
        f"{_dataset_keys(**train_keys, indent=' ' * 8)}\n"
        "        pipeline={{_base_.train_pipeline}},\n    ),\n)\n"
        f"{val}"
    )
    files = {"mmseg_dataset": output / "mmseg_dataset.py", "mmseg_train": output / "mmseg_train.py"}
    atomic_write_text(files["mmseg_dataset"], snippet)
    atomic_write_text(files["mmseg_train"], train)
    return files
