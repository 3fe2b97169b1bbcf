"""Datasets from nothing: fetch (:mod:`.download`), unpack (:mod:`.extract`), convert (:mod:`.sbd`, :mod:`.coco`), the
image-level labels and the pre-scan, in resumable steps (:mod:`.pipeline`, ``tools/prepare_data.py``)."""
