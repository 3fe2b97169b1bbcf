"""Inference: the model from a checkpoint (:class:`Segmenter`), the dense CRF (:mod:`wsss.inference.crf`), runs over
folders, lists and VOC splits (:func:`run_inference`, :mod:`wsss.inference.folder`) and the exports
(:mod:`wsss.inference.exports`)."""

from wsss.inference.folder.merge import InferenceSummary
from wsss.inference.folder.runner import InferenceOptions, run_inference
from wsss.inference.predictor import Segmentation, Segmenter

__all__ = ["InferenceOptions", "InferenceSummary", "Segmentation", "Segmenter", "run_inference"]
