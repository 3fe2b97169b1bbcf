"""The inference loop (wsss/inference/folder/loop.py) without a model: what it says about an image it cannot read."""

from __future__ import annotations

from pathlib import Path

from wsss.inference.folder.loop import InferenceLoop, LoopSetup
from wsss.inference.folder.merge import InferenceSummary
from wsss.inference.folder.sources import Source


def test_an_unreadable_image_is_skipped_with_one_wording(tmp_path: Path):
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"\xff\xd8\xff not really a jpeg")
    setup = LoopSetup(segmenter=None, output=tmp_path / "out", scales=(1.0,), flip=False, max_size=0,
                      logits_stride=4, batch_size=1, num_workers=0, progress=False, cams=False)  # fmt: skip
    loop = InferenceLoop(setup, crf=None)
    loop.run([(Source("bad.jpg", bad), {})])
    reason = f"not a readable image (cannot identify image file '{bad}')"
    assert [(s.path, s.reason) for s in loop.skipped] == [("bad.jpg", reason)]
    summary = InferenceSummary(output=tmp_path / "out", skipped=loop.skipped)
    assert f"  skipped bad.jpg: {reason}" in summary.format().splitlines()
