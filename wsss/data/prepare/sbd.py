"""SBD (Hariharan et al. 2011) -> ``SegmentationClassAug`` PNGs and the ``train_aug`` split.

SBD ships ``dataset/cls/<id>.mat`` (a ``GTcls`` struct whose ``Segmentation`` field holds class indices),
``dataset/img/<id>.jpg`` and ``dataset/{train,val}.txt``. The augmented training set of the WSSS
literature is ``train_aug = (SBD train + SBD val + VOC train) - VOC val`` (10,582 images for VOC 2012).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tqdm import tqdm

from wsss.data.voc import read_split
from wsss.utils.fileio import atomic_write_bytes, atomic_write_text, read_mask, save_mask


def sbd_dataset_dir(sbd_root: str | Path) -> Path:
    """The folder holding ``cls/``: ``sbd_root`` itself or its ``dataset/`` subfolder.

    Raises:
        FileNotFoundError: Neither holds ``cls/``.
    """
    sbd_root = Path(sbd_root)
    for cand in (sbd_root, sbd_root / "dataset"):
        if (cand / "cls").is_dir():
            return cand
    raise FileNotFoundError(
        f"no SBD cls/ folder under {sbd_root} or {sbd_root / 'dataset'}; point SBD_ROOT at the unpacked "
        "benchmark_RELEASE folder"
    )


def read_sbd_mat(path: str | Path) -> np.ndarray:
    """(H, W) uint8 class indices from an SBD ``cls/*.mat`` file.

    Raises:
        ValueError: The file is unreadable or has no ``GTcls.Segmentation``.
    """
    from scipy.io import loadmat

    try:
        mat = loadmat(str(path), squeeze_me=True, struct_as_record=False)
        seg = np.asarray(mat["GTcls"].Segmentation)
    except Exception as err:  # scipy raises MatReadError, IndexError, ValueError ... for corrupt files
        raise ValueError(f"{path}: not an SBD class .mat file with GTcls.Segmentation ({err})") from None
    if seg.ndim != 2:
        raise ValueError(f"{path}: GTcls.Segmentation has shape {seg.shape}, expected (H, W)")
    return seg.astype(np.uint8)


def convert_sbd(
    sbd_root: str | Path,
    voc_root: str | Path,
    out_dir: str = "SegmentationClassAug",
    voc_mask_dir: str = "SegmentationClass",
    progress: bool = True,
) -> dict[str, int]:
    """Convert SBD masks into ``voc_root/out_dir`` and write ``ImageSets/Segmentation/train_aug.txt``.

    VOC's own masks (finer, with the 255 boundary band) win for ids that both datasets annotate. SBD
    images missing from ``JPEGImages`` are copied from SBD's ``img/``. Existing outputs are overwritten
    atomically, so an interrupted conversion can simply be run again. ``progress`` shows a bar per pass.

    Returns:
        Counts: ``sbd`` masks converted, ``voc`` masks copied, ``train_aug`` ids, ``images_copied``.
    """
    sbd = sbd_dataset_dir(sbd_root)
    voc_root = Path(voc_root)
    seg_sets = voc_root / "ImageSets" / "Segmentation"
    voc_train = read_split(seg_sets / "train.txt")
    voc_val = read_split(seg_sets / "val.txt")
    sbd_ids = []
    for name in ("train.txt", "val.txt"):
        if (sbd / name).is_file():
            sbd_ids += read_split(sbd / name)
    if not sbd_ids:
        sbd_ids = sorted(p.stem for p in (sbd / "cls").glob("*.mat"))
    out = voc_root / out_dir
    out.mkdir(parents=True, exist_ok=True)
    (voc_root / "JPEGImages").mkdir(exist_ok=True)

    images_copied = 0
    for image_id in tqdm(sbd_ids, desc="SBD -> PNG", unit="mask", disable=not progress):
        save_mask(out / f"{image_id}.png", read_sbd_mat(sbd / "cls" / f"{image_id}.mat"))
        jpg = voc_root / "JPEGImages" / f"{image_id}.jpg"
        if not jpg.is_file():
            src = sbd / "img" / f"{image_id}.jpg"
            if not src.is_file():
                raise FileNotFoundError(f"image {image_id} is in neither {jpg} nor {src}")
            atomic_write_bytes(jpg, src.read_bytes())
            images_copied += 1

    voc_ids = sorted(set(voc_train) | set(voc_val))
    for image_id in tqdm(voc_ids, desc="VOC masks", unit="mask", disable=not progress):
        src = voc_root / voc_mask_dir / f"{image_id}.png"
        if not src.is_file():
            raise FileNotFoundError(f"VOC mask missing: {src} (listed in {seg_sets})")
        save_mask(out / f"{image_id}.png", read_mask(src))

    train_aug = sorted((set(sbd_ids) | set(voc_train)) - set(voc_val))
    atomic_write_text(seg_sets / "train_aug.txt", "".join(f"{i}\n" for i in train_aug))
    return {"sbd": len(sbd_ids), "voc": len(voc_ids), "train_aug": len(train_aug), "images_copied": images_copied}

