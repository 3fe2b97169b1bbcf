"""Inference inputs: split ids that would leave the image folder."""

from __future__ import annotations

from wsss.inference.sources import safe_relative


def test_safe_relative():
    assert safe_relative("2007_000033") == "2007_000033"
    assert safe_relative("sub/./x") == "sub/x"
    for bad in ("../../etc/x", "/etc/passwd", "a/../../b", "", "..", "C:/x", "\\\\server\\x", "a\0b"):
        assert safe_relative(bad) is None, bad
