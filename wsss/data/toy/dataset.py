"""A small synthetic dataset in PASCAL VOC 2012 layout: the default that ``make demo`` and the tests use.

Real VOC cannot be downloaded everywhere, so :func:`make_toy_voc` writes a stand-in with the same files
and conventions (``docs/design.md`` section 4)::

    OUT_DIR/JPEGImages/<id>.jpg              RGB, 160-320 px per side, never square
    OUT_DIR/SegmentationClass/<id>.png       palette PNG, class indices, 255 = ignore band on boundaries
    OUT_DIR/Annotations/<id>.xml             VOC XML: size, one <object> per instance, 1-based <bndbox>
    OUT_DIR/ImageSets/Segmentation/{train,val,trainval}.txt
    OUT_DIR/classes.txt                      background first, one name per line
    OUT_DIR/toy_meta.json                    generator parameters and version, written last (marks it complete)

Each class is a shape with its own fill: ``disc`` (speckled), ``ring`` (solid), ``triangle``
(checkerboard), ``cross`` (polka dots), ``star`` (soft gradient) and ``striped_square`` (stripes along its
sides). 1-3 objects per image, rotated, scaled, overlapping and truncated by the border, lie in front of
1-4 distractor shapes of no class on a textured, lit background; a 255 band 4-5 px wide marks every
instance boundary, tiny and heavily occluded objects are ``difficult``. The versions differ only in how
colours (and the distractors' fills) are drawn:

* version 2 (the default; the demo's): each class has its own vivid hue (:data:`CLASS_HUES`) on muted
  background and distractors, so colour gives the class away.
* version 3: objects, distractors and background draw colours from one distribution shared by every
  class (vivid or muted), and a quarter of the distractors wear a class's patterned fill: the class is
  the pair of shape and fill, and neither colour nor fill alone decides it.

Design rationale and history (versions 1-3, with numbers): ``docs/toy_dataset.md``.

Generation is deterministic: image ``i`` of a split draws from ``numpy.random.default_rng((seed, split,
i))``, so the same seed and version give byte-identical files (PIL's JPEG and PNG encoders are
deterministic), and adding images never changes the existing ones. Drawing takes about 25 ms per image.
"""

from __future__ import annotations

import io
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import cv2
import numpy as np
from PIL import Image
from tqdm import tqdm

from wsss.data.classes import voc_palette
from wsss.data.toy.render import (
    DEFAULT_TOY_VERSION,
    IGNORE_INDEX,
    TOY_CLASSES,
    ToyObject,
    check_version,
    generate_sample,
)
from wsss.utils.fileio import atomic_write_bytes, atomic_write_text, read_image, read_mask, save_image, save_mask

META_FILE = "toy_meta.json"
SPLITS = ("train", "val")
_ID_PATTERN = re.compile(r"^(train|val)_\d{5}$")
_IMAGE_DIRS = ("JPEGImages", "SegmentationClass", "Annotations")


def annotation_xml(image_id: str, width: int, height: int, objects: list[ToyObject]) -> str:
    """The VOC ``Annotations/<id>.xml`` text of one image."""
    root = ET.Element("annotation")
    ET.SubElement(root, "folder").text = "ToyVOC"
    ET.SubElement(root, "filename").text = f"{image_id}.jpg"
    source = ET.SubElement(root, "source")
    ET.SubElement(source, "database").text = "wsss toy VOC"
    size = ET.SubElement(root, "size")
    for tag, value in (("width", width), ("height", height), ("depth", 3)):
        ET.SubElement(size, tag).text = str(value)
    ET.SubElement(root, "segmented").text = "1"
    for obj in objects:
        node = ET.SubElement(root, "object")
        ET.SubElement(node, "name").text = obj.name
        ET.SubElement(node, "pose").text = "Unspecified"
        ET.SubElement(node, "truncated").text = str(int(obj.truncated))
        ET.SubElement(node, "occluded").text = str(int(obj.occluded))
        ET.SubElement(node, "difficult").text = str(int(obj.difficult))
        box = ET.SubElement(node, "bndbox")
        for tag, value in zip(("xmin", "ymin", "xmax", "ymax"), obj.bbox, strict=True):
            ET.SubElement(box, tag).text = str(value)
    ET.indent(root, space="\t")
    return ET.tostring(root, encoding="unicode") + "\n"


# ---------------------------------------------------------------------------------------------------------
# The dataset on disk


def _split_ids(num_train: int, num_val: int) -> dict[str, list[str]]:
    return {
        "train": [f"train_{i:05d}" for i in range(num_train)],
        "val": [f"val_{i:05d}" for i in range(num_val)],
    }


def _meta(num_train: int, num_val: int, seed: int, version: int) -> dict:
    return {
        "generator": "wsss.data.toy",  # an identifier of the generator, stable across module moves
        "version": version,
        "num_train": num_train,
        "num_val": num_val,
        "seed": seed,
        "classes": list(TOY_CLASSES),
    }


def toy_voc_is_complete(
    out_dir: str | Path,
    num_train: int = 400,
    num_val: int = 100,
    seed: int = 0,
    version: int = DEFAULT_TOY_VERSION,
) -> bool:
    """True when ``out_dir`` holds a finished toy dataset made with these parameters and this version."""
    out_dir = Path(out_dir)
    try:
        meta = json.loads((out_dir / META_FILE).read_text())
    except (OSError, ValueError):
        return False
    if meta != _meta(num_train, num_val, seed, version):
        return False
    ids = [i for split in _split_ids(num_train, num_val).values() for i in split]
    return all(
        (out_dir / sub / f"{i}{ext}").is_file()
        for i in ids
        for sub, ext in (("JPEGImages", ".jpg"), ("SegmentationClass", ".png"), ("Annotations", ".xml"))
    )


def make_toy_voc(
    out_dir: str | Path,
    num_train: int = 400,
    num_val: int = 100,
    seed: int = 0,
    version: int = DEFAULT_TOY_VERSION,
    overwrite: bool = False,
    progress: bool = False,
) -> Path:
    """Write toy set ``version`` in VOC layout into ``out_dir`` (see the module docstring) and return it.
    ``progress`` shows a progress bar over the images.

    Idempotent: a complete dataset with the same parameters and version is left as it is. Otherwise the marker
    ``toy_meta.json`` is removed first and written last, so an interrupted run is redone next time;
    files of toy ids that the new parameters no longer use are deleted. Every file is written atomically.
    A folder holding files the generator does not write (another dataset, a label file) is refused unless
    ``overwrite``.

    Raises:
        ValueError: ``num_train`` < 1 or ``num_val`` < 1, ``version`` not in :data:`TOY_VERSIONS`, or
            ``out_dir`` holds other files and ``overwrite`` is False.
    """
    if num_train < 1 or num_val < 1:
        raise ValueError(f"need at least one train and one val image, got {num_train=} {num_val=}")
    check_version(version)  # fail before touching out_dir
    out_dir = Path(out_dir)
    if toy_voc_is_complete(out_dir, num_train, num_val, seed, version):
        return out_dir
    foreign = _foreign_files(out_dir)
    if foreign and not overwrite:
        raise ValueError(
            f"{out_dir} is not empty and holds files the toy generator did not write (e.g. {foreign[0]}); its "
            "splits and classes.txt would be overwritten. Pick another folder, or pass --overwrite."
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / META_FILE).unlink(missing_ok=True)

    ids = _split_ids(num_train, num_val)
    palette = voc_palette()
    bar = tqdm(total=num_train + num_val, desc="toy VOC", unit="img", dynamic_ncols=True, disable=not progress)
    for split_index, split in enumerate(SPLITS):
        for i, image_id in enumerate(ids[split]):
            sample = generate_sample(np.random.default_rng((seed, split_index, i)), version)
            h, w = sample.mask.shape
            save_image(out_dir / "JPEGImages" / f"{image_id}.jpg", sample.image, quality=90)
            save_mask(out_dir / "SegmentationClass" / f"{image_id}.png", sample.mask, palette)
            xml_text = annotation_xml(image_id, w, h, sample.objects)
            atomic_write_text(out_dir / "Annotations" / f"{image_id}.xml", xml_text)
            bar.update(1)
    bar.close()

    keep = {i for split in ids.values() for i in split}
    for sub in _IMAGE_DIRS:
        for path in sorted((out_dir / sub).iterdir()):
            if _ID_PATTERN.match(path.stem) and path.stem not in keep:
                path.unlink()

    sets = out_dir / "ImageSets" / "Segmentation"
    for split in SPLITS:
        atomic_write_text(sets / f"{split}.txt", "".join(f"{i}\n" for i in ids[split]))
    atomic_write_text(sets / "trainval.txt", "".join(f"{i}\n" for split in SPLITS for i in ids[split]))
    atomic_write_text(out_dir / "classes.txt", "".join(f"{c}\n" for c in TOY_CLASSES))
    atomic_write_text(out_dir / META_FILE, json.dumps(_meta(num_train, num_val, seed, version), indent=2) + "\n")
    return out_dir


def _foreign_files(out_dir: Path, limit: int = 3) -> list[Path]:
    """Up to ``limit`` files under ``out_dir`` that :func:`make_toy_voc` does not write (paths relative to it)."""
    own_top = {"classes.txt", META_FILE}
    own_splits = {f"{split}.txt" for split in (*SPLITS, "trainval")}
    foreign = []
    for path in sorted(out_dir.rglob("*")) if out_dir.is_dir() else []:
        rel = path.relative_to(out_dir)
        own = (
            path.is_dir()
            or rel.name.startswith(".")
            or (len(rel.parts) == 1 and rel.name in own_top)
            or (len(rel.parts) == 2 and rel.parts[0] in _IMAGE_DIRS and _ID_PATTERN.match(path.stem) is not None)
            or (rel.parent == Path("ImageSets/Segmentation") and rel.name in own_splits)
        )
        if not own:
            foreign.append(rel)
            if len(foreign) == limit:
                break
    return foreign


def save_contact_sheet(root: str | Path, path: str | Path, ids: list[str], tile_height: int = 150) -> None:
    """Write a PNG grid of images from a VOC-layout ``root``, each beside its mask overlay.

    The overlay blends the VOC palette colour of each class into the image, paints the ignore band
    white and names the image's classes; two image/overlay pairs per row.
    """
    root = Path(root)
    palette = voc_palette().astype(np.float32)
    pairs = []
    for image_id in ids:
        image = read_image(root / "JPEGImages" / f"{image_id}.jpg")
        mask = read_mask(root / "SegmentationClass" / f"{image_id}.png")
        overlay = image.astype(np.float32)
        fg = (mask > 0) & (mask != IGNORE_INDEX)
        overlay[fg] = 0.35 * overlay[fg] + 0.65 * palette[mask[fg]]
        overlay[mask == IGNORE_INDEX] = 255.0
        overlay = overlay.astype(np.uint8)
        names = [TOY_CLASSES[c] for c in np.unique(mask) if 0 < c < len(TOY_CLASSES)]
        for colour, thickness in (((0, 0, 0), 2), ((255, 255, 255), 1)):
            cv2.putText(overlay, " ".join(names), (3, 12), cv2.FONT_HERSHEY_SIMPLEX, 0.35, colour, thickness)
        scale = tile_height / image.shape[0]
        size = (round(image.shape[1] * scale), tile_height)
        pair = [cv2.resize(t, size, interpolation=cv2.INTER_AREA) for t in (image, overlay)]
        pairs.append(np.concatenate([pair[0], np.full((tile_height, 2, 3), 255, np.uint8), pair[1]], axis=1))
    gap = 6
    rows = [pairs[r : r + 2] for r in range(0, len(pairs), 2)]
    row_width = max(sum(p.shape[1] for p in row) + gap * (len(row) - 1) for row in rows)
    sheet = np.full((len(rows) * (tile_height + gap) - gap, row_width, 3), 255, np.uint8)
    for r, row in enumerate(rows):
        x = 0
        for p in row:
            sheet[r * (tile_height + gap) : r * (tile_height + gap) + tile_height, x : x + p.shape[1]] = p
            x += p.shape[1] + gap
    im = Image.fromarray(sheet).quantize(256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    buf = io.BytesIO()
    im.save(buf, format="PNG", optimize=True)
    atomic_write_bytes(path, buf.getvalue())
