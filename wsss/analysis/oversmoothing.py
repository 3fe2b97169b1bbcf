"""Oversmoothing metrics for token matrices and attention maps.

Oversmoothing makes the tokens of deep transformer layers alike. Three views of it are measured here:

- ``token_cosine_similarity``: mean pairwise cosine similarity of the tokens (ContraNorm app. C, the
  ``sim_f`` of Wang et al. 2022); 1 when all tokens point the same way.
- ``effective_rank``: ``exp`` of the Shannon entropy of the L1-normalised singular values (ContraNorm
  Definition 3.1, Roy & Vetterli 2007); catches dimensional collapse that cosine similarity misses.
- ``numerical_rank``: number of singular values of ``A / ||A||_F`` above a threshold (Centered
  Self-Attention Layers, sec. 4.1, threshold 1e-3).

``layer_stats`` applies them to every block of a timm ViT. Spectral computations run in float64 whatever
the input dtype, so thresholds such as 1e-3 sit far above rounding noise.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from wsss.analysis.constants import RANK_THRESHOLD
from wsss.models.attention import VariantAttention, record_attention


def token_cosine_similarity(tokens: torch.Tensor) -> torch.Tensor:
    """Mean cosine similarity over all pairs of distinct tokens.

    Zero tokens count as orthogonal to every other token.

    Args:
        tokens: (B, N, D) token matrices, N >= 2.

    Returns:
        (B,) mean of ``cos(t_i, t_j)`` over ``i != j``, in the input's dtype.
    """
    if tokens.ndim != 3:
        raise ValueError(f"tokens must be (B, N, D), got shape {tuple(tokens.shape)}")
    n = tokens.shape[1]
    if n < 2:
        raise ValueError(f"need at least 2 tokens for a pairwise similarity, got N={n}")
    unit = F.normalize(tokens.double(), dim=-1)
    gram = unit @ unit.mT
    off_diagonal = gram.sum(dim=(-2, -1)) - gram.diagonal(dim1=-2, dim2=-1).sum(-1)
    return (off_diagonal / (n * (n - 1))).to(tokens.dtype)


def effective_rank(x: torch.Tensor) -> torch.Tensor:
    """Effective rank ``exp(H(p))`` with ``p_i = sigma_i / sum_k sigma_k`` (ContraNorm Definition 3.1).

    Ranges from 1 (one non-zero singular value) to ``min(N, D)`` (all singular values equal). ``0 log 0``
    is taken as 0; an all-zero matrix gets effective rank 0.

    Args:
        x: (..., N, D) matrices, e.g. (B, N, D) tokens.

    Returns:
        (...,) effective ranks, in the input's dtype (float64 for integer input).
    """
    if x.ndim < 2:
        raise ValueError(f"x must be (..., N, D), got shape {tuple(x.shape)}")
    s = torch.linalg.svdvals(x.double())
    total = s.sum(-1, keepdim=True)
    p = s / total.clamp_min(torch.finfo(torch.float64).tiny)
    entropy = -torch.special.xlogy(p, p).sum(-1)
    erank = torch.where(total.squeeze(-1) > 0, entropy.exp(), torch.zeros_like(entropy))
    return erank.to(x.dtype if x.is_floating_point() else torch.float64)


def numerical_rank(a: torch.Tensor, threshold: float = RANK_THRESHOLD) -> torch.Tensor:
    """Number of singular values of ``A / ||A||_F`` above ``threshold``.

    This is the rank measure of the Centered Self-Attention paper (sec. 4.1). An all-zero matrix has rank 0.

    Args:
        a: (..., N, N) attention matrices or (..., N, D) token matrices.
        threshold: Relative singular-value threshold.

    Returns:
        (...,) int64 ranks.
    """
    if a.ndim < 2:
        raise ValueError(f"a must be (..., N, M), got shape {tuple(a.shape)}")
    s = torch.linalg.svdvals(a.double())
    frobenius = torch.linalg.vector_norm(s, dim=-1, keepdim=True)  # ||A||_F = ||sigma||_2
    return (s > threshold * frobenius).sum(-1)


def _find_vit(model: nn.Module) -> nn.Module:
    for candidate in (model, getattr(model, "backbone", None)):
        if hasattr(candidate, "forward_intermediates") and hasattr(candidate, "blocks"):
            return candidate
    raise TypeError(
        f"{type(model).__name__} is neither a timm ViT (with .blocks and .forward_intermediates) nor has a "
        "`.backbone` that is one"
    )


def _attribute_matrices(block: nn.Module, mats: list[torch.Tensor], sink: list[torch.Tensor]) -> list[Any]:
    """Hook ``block`` so that the matrices appended to ``mats`` during its forward pass go to ``sink``."""
    start = [0]

    def before(module: nn.Module, args: Any) -> None:
        start[0] = len(mats)

    def after(module: nn.Module, args: Any, output: Any) -> None:
        sink.extend(mats[start[0] :])

    return [block.register_forward_pre_hook(before), block.register_forward_hook(after)]


@torch.no_grad()
def layer_stats(model: nn.Module, images: torch.Tensor, threshold: float = RANK_THRESHOLD) -> list[dict[str, Any]]:
    """Per-block oversmoothing statistics of a timm ViT on one batch.

    Token statistics use each block's output patch tokens (prefix tokens such as the class token dropped,
    no final norm) from ``forward_intermediates``. Attention ranks use the (B, heads, N, N) matrices
    (prefix tokens included) that ``wsss.models.attention.record_attention`` captures; blocks whose
    attention is not recorded (not a variant block; every block of a plain timm ViT) get ``None``. Put the
    model in eval mode first.

    Args:
        model: A timm ``VisionTransformer`` or a module whose ``.backbone`` is one.
        images: (B, 3, H, W) normalised images.
        threshold: Relative singular-value threshold of ``numerical_rank``.

    Returns:
        One dict per block, in order: ``layer`` (block index), ``cosine`` (batch mean of
        ``token_cosine_similarity``), ``effective_rank`` (batch mean of the token matrices' effective rank),
        ``attn_numerical_rank`` (mean ``numerical_rank`` over batch and heads, or ``None``).
    """
    vit = _find_vit(model)
    n_blocks = len(vit.blocks)
    per_block: dict[int, list[torch.Tensor]] = {i: [] for i in range(n_blocks)}
    has_variant = any(isinstance(m, VariantAttention) for m in model.modules())
    with record_attention(model) if has_variant else nullcontext([]) as mats:
        handles = [
            hook for i, block in enumerate(vit.blocks) for hook in _attribute_matrices(block, mats, per_block[i])
        ]
        try:
            tokens = vit.forward_intermediates(
                images, indices=list(range(n_blocks)), norm=False, output_fmt="NLC", intermediates_only=True
            )
        finally:
            for handle in handles:
                handle.remove()

    rows = []
    for i, layer_tokens in enumerate(tokens):
        attn = per_block[i]
        attn_rank = None
        if attn:
            ranks = torch.cat([numerical_rank(m, threshold).flatten() for m in attn])
            attn_rank = ranks.double().mean().item()
        rows.append(
            {
                "layer": i,
                "cosine": token_cosine_similarity(layer_tokens).double().mean().item(),
                "effective_rank": effective_rank(layer_tokens).double().mean().item(),
                "attn_numerical_rank": attn_rank,
            }
        )
    return rows
