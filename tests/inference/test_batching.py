"""Size buckets: batches of one image size and a bounded number of pixels, bounded waiting."""

from __future__ import annotations

import pytest

from wsss.inference.folder.batching import SizeBuckets


def test_size_buckets():
    b = SizeBuckets(batch_size=2, window=2)  # at most 4 waiting
    assert b.add("a", (1, 1)) == []
    assert b.add("b", (2, 2)) == []
    assert b.add("c", (1, 1)) == [["a", "c"]]
    assert b.add("d", (3, 3)) == []
    assert b.add("e", (4, 4)) == []
    assert b.add("f", (5, 5)) == []  # four waiting: b, d, e, f
    assert b.add("g", (6, 6)) == [["b"]]  # five: the oldest bucket goes
    assert b.flush() == [["d"], ["e"], ["f"], ["g"]]
    assert b.flush() == []
    one = SizeBuckets(batch_size=1)
    assert one.add("x", (1, 1)) == [["x"]]
    with pytest.raises(ValueError):
        SizeBuckets(0)


def test_a_batch_holds_at_most_batch_pixels_pixels_at_the_size_the_model_sees():
    """``infer.batch_pixels``: the defaults (16 images, 16 x 640 x 480 pixels) run VOC and COCO images 16 at a time, a
    1024 x 1024 image 4 at a time, a huge one as the 1024 px image the model sees (``max_size``), and an image above
    the budget alone; the count is the model's pixels, not the file's."""
    b = SizeBuckets(batch_size=16, batch_pixels=16 * 640 * 480, max_size=1024)
    sizes = {(375, 500, 3): 16, (480, 640, 3): 16, (1024, 1024, 3): 4, (12000, 12000, 3): 4, (1000, 1024, 3): 4,
             (1025, 1024, 3): 4, (2048, 1536, 3): 6}  # fmt: skip
    assert {size: b.capacity(size) for size in sizes} == sizes  # 2048 x 1536 is seen as 1024 x 768
    assert SizeBuckets(batch_size=4, batch_pixels=10, max_size=1024).capacity((5, 5, 3)) == 1  # above: alone
    assert SizeBuckets(batch_size=4, batch_pixels=50, max_size=1024).capacity((5, 5, 3)) == 2
    assert SizeBuckets(batch_size=4, batch_pixels=49, max_size=1024).capacity((5, 5, 3)) == 1
    assert SizeBuckets(batch_size=4, max_size=1024).capacity((4000, 4000, 3)) == 4  # no pixel budget
    big = SizeBuckets(batch_size=16, batch_pixels=16 * 640 * 480, max_size=1024)
    ready = [big.add(i, (1024, 1024, 3)) for i in range(9)]
    assert [batch for batches in ready for batch in batches] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert big.flush() == [[8]]


def test_the_decoded_pixels_waiting_are_bounded_too():
    """Huge images (a 12000 x 12000 PNG decodes to 432 MB, and the model sees it as 1024 x 1024: 4 to a batch) do
    not wait 64 at a time: at most ``window * batch_pixels`` decoded pixels wait, the oldest bucket runs beyond."""
    b = SizeBuckets(batch_size=16, batch_pixels=100, max_size=1024, window=2)  # 200 pixels may wait
    assert [b.add(i, (5, 5, 3)) for i in range(4)] == [[], [], [], [[0, 1, 2, 3]]]  # a full batch: none waits now
    assert [b.add(i, size) for i, size in enumerate([(7, 7, 3), (6, 7, 3), (5, 8, 3), (6, 6, 3)])] == [[], [], [], []]
    assert b.add(4, (5, 7, 3)) == [[0]]  # 202 pixels waiting: the oldest bucket goes
    assert b.flush() == [[1], [2], [3], [4]]
    shrunk = SizeBuckets(batch_size=16, batch_pixels=400, max_size=10, window=2)  # 800 pixels may wait
    assert shrunk.capacity((40, 40, 3)) == 4  # seen as 10 x 10
    assert shrunk.add("huge", (40, 40, 3)) == [["huge"]]  # 1600 decoded pixels: it runs as it comes
    assert [shrunk.add(i, (20, 20, 3)) for i in range(3)] == [[], [], [[0, 1, 2]]]  # 1200 waiting: before 4
