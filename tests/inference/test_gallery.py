"""The HTML gallery of an inference run."""

from __future__ import annotations

from wsss.inference.gallery import write_gallery


def test_gallery_escapes_names(tmp_path):
    rel = 'we"ird <b>&name #1.jpg'
    path = write_gallery(tmp_path, [rel], {rel: {"cam_classes": ["<cat>"], "top1_fallback": True}})
    page = path.read_text()
    assert "<b>" not in page and "<cat>" not in page
    assert "we&quot;ird &lt;b&gt;&amp;name #1.jpg" in page and "&lt;cat&gt; (top-1)" in page
    assert 'src="thumbs/we%22ird%20%3Cb%3E%26name%20%231.jpg"' in page
    assert str(tmp_path) not in page  # relative links only


# ---------------------------------------------------------------------------------------------------------
# End to end on a trained tiny model
