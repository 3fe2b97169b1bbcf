"""The output folder of tools/infer.py (issue 31): the clean-up deletes only the project's own temporaries, every
name that fits is written and one that cannot is named, and --list and OUTPUT-inside-INPUT account for every file."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tools import infer as infer_cli
from wsss.utils.fileio import temporary_prefix

pytestmark = pytest.mark.usefixtures("one_thread")

FAST = ["--scales", "1.0", "--no-flip", "--workers", "0", "--no-progress", "--device", "cpu"]


def copy_image(root: Path, target: Path, image_id: str = "val_00000") -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(root / "JPEGImages" / f"{image_id}.jpg", target)


def dead_pid() -> int:
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True).stdout)


def summary_of(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def test_the_clean_up_never_deletes_a_users_file(toy_checkpoint, tmp_path):
    """The issue's repro: OUTPUT p holds INPUT p/photos and the user's p/notes; only a killed run's temporary in
    OUTPUT's own folders goes."""
    root, ckpt = toy_checkpoint
    p = tmp_path / "p"
    copy_image(root, p / "photos" / "x.jpg")
    dead = dead_pid()
    users = [
        p / "notes" / f".report.{dead}.draft.tmp",  # named like the temporaries of earlier versions
        p / "notes" / f"{temporary_prefix('a.png', dead)}k2j4h_x1.tmp",  # even with the project's mark
        p / "photos" / f".x.jpg.{dead}.abcdefgh.tmp",
        p / f".notes.txt.{dead}.q1w2e3r4.tmp",
    ]
    stale = p / "masks" / f"{temporary_prefix('x.png', dead)}q1w2e3r4.tmp"
    other_host = p / "masks" / f"{temporary_prefix('y.png', dead, host='node-b')}q1w2e3r4.tmp"
    for path in [*users, stale, other_host]:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("keep\n")
    assert infer_cli.main([str(ckpt), str(p / "photos"), str(p), *FAST]) == 0
    assert (p / "masks" / "x.png").is_file()
    assert [path.read_text() for path in users] == ["keep\n"] * len(users)
    assert not stale.exists() and other_host.exists()  # a live run on another host may be writing it


def test_a_name_that_fits_is_written_and_one_that_cannot_is_named(toy_checkpoint, tmp_path, capsys):
    """A 254-byte name is written whole (its temporary too); a 255-byte x.jpg, whose labels/x.json would be 256
    bytes, is skipped and named; the run goes on to the images after it."""
    root, ckpt = toy_checkpoint
    inp, out = tmp_path / "in", tmp_path / "out"
    fits, too_long = "a" * 250 + ".jpg", "b" * 251 + ".jpg"
    for name in (fits, too_long, "c.jpg"):
        copy_image(root, inp / name)
    assert infer_cli.main([str(ckpt), str(inp), str(out), *FAST, "--gallery"]) == 0
    assert sorted(p.name for p in (out / "masks").iterdir()) == ["a" * 250 + ".png", "c.png"]
    assert (out / "labels" / ("a" * 250 + ".json")).is_file()
    summary = summary_of(out)
    assert summary["done"] == 2
    (skipped,) = summary["skipped"]
    assert skipped["path"] == too_long and "256 bytes, over the 255" in skipped["reason"]
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]


def test_a_name_that_is_not_utf8_gets_its_gallery_and_summary(toy_checkpoint, tmp_path):
    root, ckpt = toy_checkpoint
    inp, out = tmp_path / "in", tmp_path / "out"
    name = os.fsdecode(b"caf\xe9.jpg")  # Latin-1, not UTF-8
    copy_image(root, inp / name)
    copy_image(root, inp / "plain.jpg", "val_00001")
    out.mkdir()
    (out / "summary.json").write_text('{"done": 99}\n')  # an old summary must not survive
    assert infer_cli.main([str(ckpt), str(inp), str(out), *FAST, "--gallery"]) == 0
    assert summary_of(out)["done"] == 2
    page = (out / "index.html").read_text(encoding="utf-8")
    assert 'src="thumbs/caf%E9.jpg"' in page and "caf\ufffd.jpg<br>" in page  # the link finds the file
    assert set(json.loads((out / "image_labels.json").read_text())["images"]) == {name, "plain.jpg"}


def test_images_in_an_output_folder_inside_input_are_named(toy_checkpoint, tmp_path):
    """OUTPUT inside INPUT: its own files are left out silently, a user's image lying in it is skipped and named."""
    root, ckpt = toy_checkpoint
    inp = tmp_path / "p"
    out = inp / "out"
    copy_image(root, inp / "x.jpg")
    copy_image(root, out / "holiday.jpg", "val_00001")
    assert infer_cli.main([str(ckpt), str(inp), str(out), *FAST, "--gallery"]) == 0
    assert infer_cli.main([str(ckpt), str(inp), str(out), *FAST, "--gallery"]) == 0  # thumbs/ etc. now exist
    summary = summary_of(out)
    assert (summary["done"], summary["existing"]) == (0, 1)
    assert [s["path"] for s in summary["skipped"]] == ["out/holiday.jpg"]
    assert "output folder" in summary["skipped"][0]["reason"]


def test_a_list_through_a_folder_loop_reads_each_file_once(toy_checkpoint, tmp_path):
    root, ckpt = toy_checkpoint
    inp, out = tmp_path / "in", tmp_path / "out"
    copy_image(root, inp / "a.jpg")
    (inp / "loop").symlink_to(".", target_is_directory=True)
    listing = tmp_path / "list.txt"
    listing.write_text("a.jpg\nloop/a.jpg\nloop/loop/a.jpg\n")
    assert infer_cli.main([str(ckpt), str(inp), str(out), "--list", str(listing), *FAST]) == 0
    assert [p.relative_to(out / "masks").as_posix() for p in (out / "masks").rglob("*.png")] == ["a.png"]
    skipped = summary_of(out)["skipped"]
    assert [s["path"] for s in skipped] == ["loop/a.jpg", "loop/loop/a.jpg"]
    assert all("the same file as a.jpg (line 1)" in s["reason"] for s in skipped)


def test_a_list_line_may_hold_any_character_but_newline(toy_checkpoint, tmp_path):
    """U+2028 (and the other characters str.splitlines breaks at) is part of a name; line numbers stay the editor's."""
    root, ckpt = toy_checkpoint
    inp, out = tmp_path / "in", tmp_path / "out"
    odd = "a\u2028b\x0cc.jpg"
    copy_image(root, inp / odd)
    listing = tmp_path / "list.txt"
    listing.write_text(f"{odd}\n../escape.jpg\r\nmissing.jpg\n", encoding="utf-8", newline="")
    assert infer_cli.main([str(ckpt), str(inp), str(out), "--list", str(listing), *FAST]) == 0
    assert (out / "masks" / "a\u2028b\x0cc.png").is_file()
    reasons = [s["reason"].split(": ")[0] for s in summary_of(out)["skipped"]]
    assert sorted(reasons) == [f"{listing}:2", f"{listing}:3"]


def test_the_merge_names_every_listed_image_no_rank_finished(tmp_path):
    """A run never says "done" with outputs missing: an image no rank accounts for, or whose mask vanished, is
    named as skipped and not counted."""
    from wsss.data.folder import Skipped
    from wsss.inference.folder.layout import OutputLayout
    from wsss.inference.folder.merge import RankPart, merge_parts

    layout = OutputLayout(tmp_path, ["masks", "labels"])
    for rel in ("a.jpg", "b.jpg"):
        path = layout.paths(rel)["masks"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"png")
    parts = [RankPart(finished=["a.jpg", "c.jpg"]), RankPart(existing=["b.jpg"], skipped=[Skipped("d.jpg", "bad")])]
    summary = merge_parts(parts, ["a.jpg", "b.jpg", "c.jpg", "d.jpg", "e.jpg"], [Skipped("x.txt", "no image")], layout)
    assert (summary.done, summary.existing) == (1, 1)
    assert [s.path for s in summary.skipped] == ["c.jpg", "d.jpg", "e.jpg", "x.txt"]
    assert "vanished" in summary.skipped[0].reason and "no rank finished it" in summary.skipped[2].reason


def test_the_merge_after_a_stop_names_no_unreached_image(tmp_path):
    """A run stopped by an output it could not write (a full disk) leaves its unreached images for the next run and
    says how many in its error: they are not named as skipped ("no rank finished it"), which would send the user
    looking for inputs that changed."""
    import errno

    from wsss.inference.folder.layout import OutputLayout
    from wsss.inference.folder.merge import RankPart, merge_parts
    from wsss.inference.folder.sources import OutputError

    layout = OutputLayout(tmp_path, ["masks", "labels"])
    path = layout.paths("a.jpg")["masks"]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"png")
    full = OutputError(layout.paths("b.jpg")["masks"], OSError(errno.ENOSPC, "No space left on device"))
    parts = [RankPart(finished=["a.jpg"], failure=full, left=2)]
    summary = merge_parts(parts, ["a.jpg", "b.jpg", "c.jpg"], [], layout)
    assert (summary.done, summary.skipped) == (1, [])


def test_image_labels_hold_only_entries_of_the_runs_classes(tmp_path):
    """A labels/ entry left by an earlier run with another checkpoint (other classes) is not merged into
    image_labels.json, whose class list is this run's: its names would index other classes."""
    from wsss.inference.folder.layout import OutputLayout
    from wsss.inference.folder.merge import InferenceSummary, write_run_files

    layout = OutputLayout(tmp_path, ["masks", "labels"])
    classes = ["background", "cat", "dog"]
    entries = {
        "a.jpg": {"classes": classes, "present": ["cat"], "top1_fallback": False, "scores": {"cat": 0.9, "dog": 0.1}},
        "b.jpg": {"classes": ["background", "car"], "present": ["car"], "top1_fallback": False, "scores": {"car": 0.8}},
    }
    for rel, entry in entries.items():
        path = layout.paths(rel)["labels"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(entry))
    assert write_run_files(layout, ["a.jpg", "b.jpg"], classes, 0.5, None, InferenceSummary(tmp_path), [], 0) == []
    labels = json.loads(layout.labels_file.read_text())
    assert labels["classes"] == classes and list(labels["images"]) == ["a.jpg"]
    assert labels["images"]["a.jpg"] == {"present": ["cat"], "top1_fallback": False, "scores": {"cat": 0.9, "dog": 0.1}}


def test_two_inputs_with_one_output_name_keep_the_first(tmp_path):
    """a.jpg and a.png both name masks/a.png: the first (sorted) is kept, the other skipped naming it, so no two
    images write one file (the listing is decided once, before it is shared out among ranks)."""
    import numpy as np

    from wsss.inference.folder.layout import OutputLayout
    from wsss.inference.folder.plan import list_inputs
    from wsss.utils.fileio import save_image

    inp = tmp_path / "in"
    for name in ("a.jpg", "a.png", "sub/a.png", "b.png"):
        (inp / name).parent.mkdir(parents=True, exist_ok=True)
        save_image(inp / name, np.full((4, 5, 3), 90, np.uint8))
    listing = list_inputs(inp, OutputLayout(tmp_path / "out"), None, None, ("SegmentationClass",), False)
    assert [s.rel for s in listing.sources] == ["a.jpg", "b.png", "sub/a.png"]
    assert [(s.path, s.reason) for s in listing.skipped] == [("a.png", "its outputs would overwrite those of a.jpg")]


def test_a_symlinked_kind_folder_is_not_cleaned(tmp_path):
    """The start-of-run clean-up never enters a kind folder that is a symlink: the temporaries in its target (another
    run's folder, anything the link points to) are not OUTPUT's. A real kind folder's are removed."""
    from wsss.inference.folder.layout import OutputLayout
    from wsss.utils.fileio import temporary_prefix

    dead = dead_pid()
    elsewhere, out = tmp_path / "elsewhere", tmp_path / "out"
    theirs = elsewhere / f"{temporary_prefix('x.png', dead)}q1w2e3r4.tmp"
    ours = out / "labels" / f"{temporary_prefix('x.json', dead)}q1w2e3r4.tmp"
    for path in (theirs, ours):
        path.parent.mkdir(parents=True)
        path.write_text("partial\n")
    (out / "masks").symlink_to(elsewhere, target_is_directory=True)
    assert OutputLayout(out, ["masks", "labels"]).remove_stale_temporaries() == [ours]
    assert theirs.read_text() == "partial\n" and not ours.exists()
