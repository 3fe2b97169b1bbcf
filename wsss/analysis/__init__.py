"""Diagnostics of oversmoothing: token/attention metrics and the rank simulation of paper Fig. 1."""
