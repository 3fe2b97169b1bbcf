"""The output folder of ``tools/infer.py``: every path under OUTPUT, what is finished, what is a temporary.

:class:`OutputLayout` is the one owner of that layout (:mod:`wsss.inference.folder.runner` lists the files). Each kind
of :data:`OUTPUT_KINDS` is a folder that mirrors the inputs' relative paths; the run files (``run.json``,
``summary.json``, ``image_labels.json``, ``index.html``) lie at the top. An image is finished when every file of
the kinds the run writes exists (the mask, written last, marks it).

What the layout guarantees:

- The start-of-run clean-up (:meth:`OutputLayout.remove_stale_temporaries`) looks only at OUTPUT's top level and
  in its kind folders, and deletes there only the temporaries of :func:`wsss.utils.fileio.atomic_open` that a
  killed process of this host left (:func:`~wsss.utils.fileio.remove_stale_temporaries`). Any other file under
  OUTPUT (an input folder inside it, a user's notes) is never deleted, whatever its name.
- An input never lies in a kind folder (:meth:`OutputLayout.check_input`), so no output replaces an input.
- A name whose outputs the file system cannot hold (a component over :data:`NAME_MAX` bytes) is reported by
  :meth:`OutputLayout.unwritable` before anything is written, so the run skips that image and names it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path, PurePosixPath

from wsss.utils.fileio import remove_stale_temporaries

__all__ = ["NAME_MAX", "OUTPUT_KINDS", "RUN_FILES", "OutputLayout"]

OUTPUT_KINDS = {
    "masks": ".png", "labels": ".json", "overlays": ".jpg", "cams": ".jpg", "logits": ".npy", "thumbs": ".jpg",
    "mask_thumbs": ".png", "class_cams": "", "gt": ".png",
}  # fmt: skip
"""The folders under OUTPUT that mirror the input's relative paths, with the suffix of their files; ``class_cams``
holds a folder per image (one file per class, named by its index)."""
GALLERY_KINDS = ("mask_thumbs", "class_cams", "gt")
"""Kinds the gallery writes besides the run's own kinds (with ``thumbs``)."""
RUN_FILES = ("run.json", "summary.json", "image_labels.json", "index.html")
"""The files at the top of OUTPUT."""
NAME_MAX = 255
"""Bytes in one path component on the common file systems (ext4, xfs, btrfs, APFS, NTFS in UTF-16 units)."""


class OutputLayout:
    """Paths under an inference OUTPUT folder.

    Args:
        root: OUTPUT.
        kinds: The kinds of :data:`OUTPUT_KINDS` written for every image this run (``thumbs`` means the gallery
            and its kinds too).
    """

    def __init__(self, root: str | Path, kinds: Sequence[str] = ("masks",)) -> None:
        self.root, self.kinds = Path(root), list(kinds)

    @property
    def run_file(self) -> Path:
        return self.root / "run.json"

    @property
    def summary_file(self) -> Path:
        return self.root / "summary.json"

    @property
    def labels_file(self) -> Path:
        return self.root / "image_labels.json"

    def paths(self, rel: str, kinds: Iterable[str] | None = None) -> dict[str, Path]:
        """Path of each kind (default: the run's kinds) for input ``rel``: a file, or for ``class_cams`` a folder."""
        stem = PurePosixPath(rel).with_suffix("")
        return {k: self.root / k / f"{stem}{OUTPUT_KINDS[k]}" for k in (self.kinds if kinds is None else kinds)}

    def written(self, rel: str) -> list[Path]:
        """Every path this run may write for ``rel``: its kinds and, with the gallery, the gallery's."""
        gallery = GALLERY_KINDS if "thumbs" in self.kinds else ()
        return list(self.paths(rel, [*self.kinds, *gallery]).values())

    def class_cam_paths(self, rel: str, indices: Sequence[int]) -> dict[int, Path]:
        """``class_cams/<stem>/<k>.jpg`` of input ``rel`` for each class index k: a folder per image and files named
        by index, so no two images share a file and a class name never becomes a path."""
        folder = self.paths(rel, ["class_cams"])["class_cams"]
        return {k: folder / f"{k}.jpg" for k in indices}

    def finished(self, rel: str) -> bool:
        """Whether every file of the run's kinds exists for ``rel``."""
        return all(p.is_file() for p in self.paths(rel).values())

    def unwritable(self, rel: str) -> str | None:
        """Why the outputs of ``rel`` cannot exist on the file system (a name over :data:`NAME_MAX` bytes), or None.

        The temporaries' names are bounded (:data:`~wsss.utils.fileio.TEMPORARY_NAME_BYTES`), so every name that
        fits has a temporary that fits.
        """
        for path in self.written(rel):
            long = next((n for n in path.relative_to(self.root).parts if len(os.fsencode(n)) > NAME_MAX), None)
            if long is not None:
                return (
                    f"its output name {long[:40]}... is {len(os.fsencode(long))} bytes, over the {NAME_MAX} a file "
                    "name may have; rename the input"
                )
        return None

    def owns(self, path: str | Path) -> bool:
        """Whether ``path`` (symlinks resolved) is one of OUTPUT's run files or lies in one of its kind folders."""
        try:
            parts = Path(os.path.realpath(path)).relative_to(os.path.realpath(self.root)).parts
        except ValueError:
            return False
        return bool(parts) and (parts[0] in OUTPUT_KINDS if len(parts) > 1 else parts[0] in RUN_FILES)

    def remove_stale_temporaries(self) -> list[Path]:
        """Delete the temporaries killed writers of this host left at OUTPUT's top and in its kind folders (never
        elsewhere: see the module docstring); a symlinked kind folder is not entered. Returns the deleted files."""
        removed = remove_stale_temporaries(self.root)
        for kind in OUTPUT_KINDS:
            folder = self.root / kind
            if folder.is_dir() and not folder.is_symlink():
                removed += remove_stale_temporaries(folder, recursive=True)
        return removed

    def check_input(self, input_path: str | Path) -> None:
        """Refuse an OUTPUT where an output could land on an input, before anything is written.

        That is OUTPUT equal to INPUT, or INPUT in (or equal to) one of OUTPUT's :data:`OUTPUT_KINDS` folders, for
        every kind, not only those this run writes: ``infer CKPT proj/thumbs proj --gallery`` would replace the
        photos by their thumbnails, ``infer CKPT p/masks p`` the ground truth by predictions. Both folders are
        compared with symlinks resolved, and a kind folder by identity (a case-insensitive file system). OUTPUT
        inside INPUT is fine: its files are never read as inputs.

        Raises:
            ValueError: One line naming both folders.
        """
        inp, out = Path(os.path.realpath(input_path)), Path(os.path.realpath(self.root))
        if inp == out:
            raise ValueError(
                f"the output folder must differ from the input folder (both are {inp}); outputs would overwrite the "
                "inputs: give another OUTPUT (default: INPUT_pred beside INPUT)"
            )
        if not inp.is_relative_to(out):
            return
        first = out / inp.relative_to(out).parts[0]
        kind = next(
            (k for k in OUTPUT_KINDS if first.name == k or ((out / k).exists() and first.samefile(out / k))), None
        )
        if kind is not None:
            raise ValueError(
                f"the input folder {input_path} lies in {kind}/ of the output folder {self.root}, where outputs "
                f"would overwrite the inputs; give an OUTPUT outside {inp} whose {kind}/ is not the input (default: "
                "INPUT_pred beside INPUT)"
            )
