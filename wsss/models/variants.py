"""The attention variants by name: the registry the config's ``model.attention.name`` selects from.

Attention classes subclass timm's ``Attention`` (:mod:`wsss.models.attention`); ``contranorm`` is a
``Block`` (:mod:`wsss.models.contranorm`).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from wsss.models.attention import (
    CenteredAttention,
    GFSAAttention,
    NeuTRENOAttention,
    VanillaAttention,
    VariantAttention,
)
from wsss.models.contranorm import ContraNorm, ContraNormBlock

__all__ = ["ATTENTION_VARIANTS", "build_attention", "get_variant", "set_fused_attention"]


ATTENTION_VARIANTS: dict[str, type[nn.Module]] = {
    "vanilla": VanillaAttention,
    "centered": CenteredAttention,
    "neutreno": NeuTRENOAttention,
    "gfsa": GFSAAttention,
    "contranorm": ContraNormBlock,
}
"""Variant name -> class. Attention classes subclass timm's ``Attention``; ``contranorm`` is a ``Block``."""


def get_variant(name: str) -> type[nn.Module]:
    """The class of variant ``name``; the error lists the valid names."""
    try:
        return ATTENTION_VARIANTS[name]
    except KeyError:
        raise ValueError(f"unknown attention variant '{name}'; valid names: {', '.join(ATTENTION_VARIANTS)}") from None


def build_attention(name: str, **kwargs: Any) -> nn.Module:
    """A new variant module, e.g. ``build_attention("centered", dim=384, num_heads=6, gamma=-1.0, qkv_bias=True)``.

    Args:
        name: One of :data:`ATTENTION_VARIANTS`.
        **kwargs: The class's constructor arguments (``contranorm`` builds a whole block).
    """
    return get_variant(name)(**kwargs)


def set_fused_attention(module: nn.Module, enabled: bool) -> int:
    """Switch every variant attention (and ContraNorm) inside ``module`` to the fused or explicit path.

    Returns:
        The number of layers switched.
    """
    layers = [m for m in module.modules() if isinstance(m, (VariantAttention, ContraNorm))]
    for m in layers:
        m.fused_attn = enabled
    return len(layers)
