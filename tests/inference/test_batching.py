"""Size buckets: batches of one image size, bounded waiting."""

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
