"""The synthetic toy dataset in PASCAL VOC layout (:mod:`.dataset`, ``tools/make_toy_voc.py``), one sample drawn by
:mod:`.render` (docs/toy_dataset.md)."""
