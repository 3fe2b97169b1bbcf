"""Predicted masks laid out and packed for the PASCAL VOC evaluation server (``tools/test.py --format-only``).

The server scores the VOC 2012 test set, whose ground truth is not public. It takes one ``.tar.gz`` archive holding
``results/VOC2012/Segmentation/comp6_test_cls/<id>.png``, one index PNG per test image at the image's size with the
VOC colour map (the devkit's ``VOClabelcolormap``, :func:`wsss.data.classes.voc_palette`) and class indices 0..20:
the layout of the devkit's ``results/`` folder, ``comp6`` being the competition for methods trained on data other
than VOC's own (here SBD and ImageNet weights; ``comp5`` is VOC 2012 data alone).

The archive is the same bytes however the masks were made (one process or several ranks): members sorted, with fixed
owner, mode and time, and a gzip header without name or time.
"""

from __future__ import annotations

import gzip
import io
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from wsss.inference.folder.sources import writing
from wsss.utils.fileio import atomic_write_bytes

RESULTS_DIR = "results/VOC2012/Segmentation/comp6_test_cls"
"""Where the server looks for the masks, inside the archive and under ``--out``."""
ARCHIVE_NAME = "results.tar.gz"
SERVER = "http://host.robots.ox.ac.uk:8080/"


@dataclass
class Submission:
    """What :func:`write_submission` wrote: the masks' folder, the archive and how many masks it holds."""

    folder: Path
    archive: Path
    num_images: int
    voc: bool
    """The class list is VOC's 21, the only one the server scores."""

    def how_to_submit(self) -> str:
        """The paragraph ``tools/test.py --format-only`` prints after writing the archive."""
        return (
            f"To score the test set, upload {self.archive} ({self.num_images} masks under {RESULTS_DIR}/) to the "
            f"PASCAL VOC evaluation server, {SERVER} (an account there first): choose VOC2012, Segmentation, "
            "comp6 (trained on data beyond VOC's: SBD and ImageNet weights) and describe the method. The server "
            "returns mIoU and per-class IoU; give its mIoU to the report: python tools/report.py WORK_DIR "
            "--test-miou MIOU."
        ) + ("" if self.voc else " Note: these classes are not VOC's 21, which are the only ones the server scores.")


def write_submission(masks: Path, out: Path, ids: list[str], rank: int = 0, world: int = 1) -> Path:
    """Copy the masks of this rank's share of ``ids`` (``ids[rank::world]``) from ``masks/<id>.png`` to
    ``out/results/VOC2012/Segmentation/comp6_test_cls/<id>.png``, each atomically; that folder.

    Raises:
        FileNotFoundError: A mask of the share is missing (its image was skipped); names the first ones.
        OutputError: A mask could not be written (one line naming it).
    """
    folder = Path(out) / RESULTS_DIR
    share = ids[rank::world]
    missing = [i for i in share if not (masks / f"{i}.png").is_file()]
    if missing:
        raise FileNotFoundError(
            f"{len(missing)} images of the split have no mask in {masks} (first: {', '.join(missing[:3])}); the "
            "server needs one per test image: see summary.json there for why they were skipped"
        )
    for image_id in share:
        target = folder / f"{image_id}.png"
        with writing(target):
            atomic_write_bytes(target, (masks / f"{image_id}.png").read_bytes())
    return folder


def write_archive(out: Path, ids: list[str]) -> Path:
    """Pack ``out/results/.../comp6_test_cls/<id>.png`` of every id into ``out/results.tar.gz``, atomically: the
    folders ``results/``, ``results/VOC2012/``, ... then the masks in id order, owner root, mode 644 (folders 755),
    time 0, so that equal masks give an equal archive byte for byte.

    Raises:
        FileNotFoundError: A mask is missing.
        OutputError: The archive could not be written.
    """
    out = Path(out)
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0) as gz:
        with tarfile.open(fileobj=gz, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            parts = PurePosixPath(RESULTS_DIR).parts
            for depth in range(1, len(parts) + 1):
                tar.addfile(_member("/".join(parts[:depth]), tarfile.DIRTYPE, 0o755))
            for image_id in sorted(ids):
                data = (out / RESULTS_DIR / f"{image_id}.png").read_bytes()
                tar.addfile(_member(f"{RESULTS_DIR}/{image_id}.png", tarfile.REGTYPE, 0o644, len(data)),
                            io.BytesIO(data))  # fmt: skip
    archive = out / ARCHIVE_NAME
    with writing(archive):
        atomic_write_bytes(archive, buf.getvalue())
    return archive


def _member(name: str, kind: bytes, mode: int, size: int = 0) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size, info.mtime = kind, mode, size, 0
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info
