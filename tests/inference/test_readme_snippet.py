"""The README's Segmenter snippet runs as printed, on the toy checkpoint, and does what its comments say."""

from __future__ import annotations

import re
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from wsss.inference.predictor import Segmentation, Segmenter

pytestmark = pytest.mark.usefixtures("one_thread")

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_snippet() -> str:
    """The README's python block that loads a Segmenter."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    (snippet,) = [b for b in blocks if "Segmenter.from_checkpoint" in b]
    return snippet


def test_the_readme_snippet_runs(toy_checkpoint, tmp_path, monkeypatch, capsys):
    root, ckpt = toy_checkpoint
    snippet = readme_snippet()
    (ckpt_path,) = re.findall(r'Segmenter\.from_checkpoint\("([^"]+)"\)', snippet)
    (tmp_path / ckpt_path).parent.mkdir(parents=True)
    shutil.copy(ckpt, tmp_path / ckpt_path)
    images = {"photo.jpg": "val_00000", "a.jpg": "val_00001", "b.jpg": "val_00000"}
    for name, image_id in images.items():
        shutil.copy(root / "JPEGImages" / f"{image_id}.jpg", tmp_path / name)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        exec(compile(snippet, str(README), "exec"), namespace)

    segmenter, result, results = namespace["segmenter"], namespace["result"], namespace["results"]
    assert isinstance(segmenter, Segmenter) and isinstance(result, Segmentation)
    expected = segmenter.predict(tmp_path / "photo.jpg", crf=True, cams=True)
    np.testing.assert_array_equal(result.mask, expected.mask)
    np.testing.assert_array_equal(np.asarray(Image.open("photo_mask.png")), result.mask)
    cam = result.cams[result.present[0]]
    np.testing.assert_array_equal(np.asarray(Image.open("photo_cam.png")), np.uint8(255 * cam))
    printed = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in printed] == result.present
    k = result.present_ids[0]
    assert f"score {result.scores[k - 1]:.2f}, {np.mean(result.mask == k):.1%} of the pixels" in printed[0]
    assert [r.mask.shape for r in results] == [Image.open(n).size[::-1] for n in ("a.jpg", "b.jpg")]
    np.testing.assert_array_equal(results[1].mask, segmenter(tmp_path / "b.jpg").mask)
