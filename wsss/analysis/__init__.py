"""Diagnostics of oversmoothing: token/attention metrics and the rank simulation of paper Fig. 1."""

from wsss.analysis.oversmoothing import effective_rank, layer_stats, numerical_rank, token_cosine_similarity

__all__ = ["effective_rank", "layer_stats", "numerical_rank", "token_cosine_similarity"]
