"""Defaults and choices of the analysis functions, without torch: tools/*.py show them in ``--help`` at once."""

RANK_THRESHOLD = 1e-3
"""Relative singular-value threshold of the numerical rank (the paper, sec. 4.1)."""

ARCHS = ("pre_ln", "post_ln", "residual")
"""Architectures of the rank simulation (:mod:`wsss.analysis.rank_simulation`)."""

INITS = ("identity", "uniform")
"""Weight initialisations of the rank simulation."""
