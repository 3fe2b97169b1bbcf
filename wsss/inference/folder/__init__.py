"""Inference over a folder, a list or a VOC split: the sources, the plan of outputs, the batched loop, the
merge of ranks' parts, the output layout, the pictures and the gallery (:func:`run_inference` in
:mod:`wsss.inference.folder.runner`)."""
