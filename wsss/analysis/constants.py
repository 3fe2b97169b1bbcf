"""Defaults and choices of the analysis functions, without torch: tools/*.py show them in ``--help`` at once."""

RANK_THRESHOLD = 1e-3
"""Relative singular-value threshold of the numerical rank (the paper, sec. 4.1)."""

FP32_PRECISION = "ieee"
"""A GPU's float32 products while the diagnostics run (:func:`wsss.utils.tensors.fp32_precision`): IEEE, as on the
CPU. TF32 rounds each operand to 10 mantissa bits, a relative error of up to 4.9e-4, half of ``RANK_THRESHOLD``, and
PyTorch's own default computes convolutions (the patch embedding) so."""

ARCHS = ("pre_ln", "post_ln", "residual")
"""Architectures of the rank simulation (:mod:`wsss.analysis.rank_simulation`)."""

INITS = ("identity", "uniform")
"""Weight initialisations of the rank simulation."""
