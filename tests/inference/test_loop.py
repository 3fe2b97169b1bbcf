"""The inference loop (wsss/inference/folder/loop.py) without a model: what it says about an image it cannot read;
the threads that write the files."""

from __future__ import annotations

import errno
import threading
import time
from concurrent.futures import wait
from pathlib import Path

import pytest

from wsss.inference.folder.loop import FileWriters, InferenceLoop, LoopSetup
from wsss.inference.folder.merge import InferenceSummary
from wsss.inference.folder.sources import OutputError, Source


def test_an_unreadable_image_is_skipped_with_one_wording(tmp_path: Path):
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"\xff\xd8\xff not really a jpeg")
    setup = LoopSetup(segmenter=None, output=tmp_path / "out", scales=(1.0,), flip=False, max_size=0,
                      logits_stride=4, batch_size=1, batch_pixels=1, num_workers=0, write_threads=0, progress=False,
                      cams=False)  # fmt: skip
    loop = InferenceLoop(setup, crf=None)
    loop.run([(Source("bad.jpg", bad), {})])
    reason = f"not a readable image (cannot identify image file '{bad}')"
    assert [(s.path, s.reason) for s in loop.skipped] == [("bad.jpg", reason)]
    summary = InferenceSummary(output=tmp_path / "out", skipped=loop.skipped)
    assert f"  skipped bad.jpg: {reason}" in summary.format().splitlines()


def _recorder(log: list, key: str, step: int, delay: float = 0.0):
    def write():
        time.sleep(delay)
        log.append((key, step, threading.current_thread() is threading.main_thread()))

    return write


def test_the_writers_run_each_images_writes_in_order_off_the_main_thread_and_finish_in_submission_order():
    """Two threads, the first images the slowest: each image's writes run in their order in a writing thread, and the
    images come out finished in the order they were queued."""
    log: list = []
    writers = FileWriters(threads=2, limit=100)
    keys = [f"img{k}" for k in range(6)]
    for k, key in enumerate(keys):
        writers.submit(key, [_recorder(log, key, step, delay=0.02 * (5 - k)) for step in range(3)])
    assert list(writers.finished(block=True)) == keys
    assert writers.close() == []
    assert sorted(log) == sorted((key, step, False) for key in keys for step in range(3))
    for key in keys:
        assert [step for k, step, _ in log if k == key] == [0, 1, 2]


def test_a_failed_write_stops_the_images_queued_after_it_and_the_one_beside_it_finishes():
    """A full disk in image b: its error comes out after a; c, written beside b in the other thread, finishes and
    close() gives it; d, queued after the failure, never starts."""
    log: list = []
    c_started = threading.Event()

    def full_disk():
        assert c_started.wait(10)
        raise OutputError(Path("out/masks/b.png"), OSError(errno.ENOSPC, "No space left on device"))

    def c_write():
        c_started.set()
        time.sleep(0.2)
        log.append("c")

    writers = FileWriters(threads=2, limit=100)
    writers.submit("a", [lambda: log.append("a")])
    writers.submit("b", [lambda: log.append("b0"), full_disk, lambda: log.append("b2")])
    writers.submit("c", [c_write])
    writers.submit("d", [lambda: log.append("d")])
    finished = writers.finished(block=True)
    assert next(finished) == "a"
    with pytest.raises(OutputError, match="the disk is full"):
        next(finished)
    wait([future for _, future in writers.pending], timeout=10)  # c and d ran or were refused: no race with close
    assert writers.close() == ["c"]
    assert sorted(log) == ["a", "b0", "c"]


def test_without_threads_the_writes_run_at_submit():
    log: list = []
    writers = FileWriters(threads=0, limit=0)
    writers.submit("a", [_recorder(log, "a", 0)])
    assert log == [("a", 0, True)] and list(writers.finished(block=False)) == ["a"]
