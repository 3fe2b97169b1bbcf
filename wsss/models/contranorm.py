"""ContraNorm (Guo et al., ICLR 2023): a token-uniformity layer after a ViT block's attention + residual.

``LayerNorm(H - s/tau * softmax(Hn Hn^T / tau) H)``; the softmax product is one SDPA call. A block-level
attention variant (``contranorm`` in :data:`wsss.models.variants.ATTENTION_VARIANTS`).
"""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from timm.models.vision_transformer import Block
from torch import Tensor, nn

from wsss.models.attention import VanillaAttention, VariantAttention

__all__ = ["ContraNorm", "ContraNormBlock"]


class ContraNorm(nn.Module):
    """ContraNorm (Guo et al., ICLR 2023, Eq. 9): ``LayerNorm(H - s/tau * softmax(Hn Hn^T / tau) H)``.

    ``H`` (B, N, D) are the tokens of one image. ``Hn`` is ``H`` with L2-normalised rows when ``normalize``
    (as in the authors' released code; on a ViT residual stream, whose token norms reach the hundreds, the
    un-normalised similarity saturates the softmax), else ``H`` itself (the paper's formula). The softmax
    product is one SDPA call with ``q = k = Hn``, ``v = H``, ``scale = 1/tau``. With ``s = 0`` the layer is
    a plain LayerNorm. The LayerNorm is new (weight 1, bias 0).

    Args:
        dim: Token dimension.
        scale: Step size ``s`` of the uniformity term.
        tau: Temperature.
        normalize: L2-normalise the tokens inside the similarity.
        eps: LayerNorm epsilon.
    """

    def __init__(
        self,
        dim: int,
        *,
        scale: float,
        tau: float,
        normalize: bool,
        eps: float = 1e-6,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        if tau <= 0:
            raise ValueError(f"contranorm: tau must be > 0, got {tau}")
        self.scale = float(scale)
        self.tau = float(tau)
        self.normalize = normalize
        self.fused_attn = True
        self.norm = nn.LayerNorm(dim, eps=eps, device=device, dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:
        """(B, N, D) -> (B, N, D)."""
        if self.scale != 0.0:
            x = x - (self.scale / self.tau) * self.uniformity_term(x)
        return self.norm(x)

    def uniformity_term(self, x: Tensor) -> Tensor:
        """``softmax(Hn Hn^T / tau) H`` (B, N, D)."""
        key = F.normalize(x, dim=-1) if self.normalize else x
        if self.fused_attn:
            key = key[:, None]
            return F.scaled_dot_product_attention(key, key, x[:, None], scale=1.0 / self.tau)[:, 0]
        sim = (key @ key.transpose(-2, -1) / self.tau).softmax(dim=-1)
        return sim @ x

    def extra_repr(self) -> str:
        return f"scale={self.scale}, tau={self.tau}, normalize={self.normalize}"


class ContraNormBlock(Block):
    """timm's pre-norm ViT block with :class:`ContraNorm` after the attention + residual.

    ``x = ContraNorm(x + attn(norm1(x))); x = x + mlp(norm2(x))``. The attention is
    :class:`VanillaAttention` (so it has the explicit path and is recorded by :func:`record_attention`; the
    ContraNorm similarity is not recorded). The block's timm parameter names are unchanged; the new ones are
    ``contra_norm.norm.weight`` and ``contra_norm.norm.bias``.

    Args:
        dim: Token dimension.
        num_heads: Number of heads.
        scale: ContraNorm step ``s``.
        tau: ContraNorm temperature.
        normalize: L2-normalise tokens inside the similarity (the authors' code); False is the paper's raw form.
        **block_kwargs: Passed to :class:`timm.models.vision_transformer.Block`.
    """

    config_fields = ("scale", "tau", "normalize")

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        scale: float,
        tau: float,
        normalize: bool,
        **block_kwargs: Any,
    ) -> None:
        super().__init__(dim, num_heads, attn_layer=VanillaAttention, **block_kwargs)
        factory = {"device": block_kwargs.get("device"), "dtype": block_kwargs.get("dtype")}
        self.contra_norm = ContraNorm(dim, scale=scale, tau=tau, normalize=normalize, **factory)

    @classmethod
    def from_timm(cls, block: Block, *, scale: float, tau: float, normalize: bool) -> ContraNormBlock:
        """The ContraNorm block around the submodules (and weights) of a timm ``Block``."""
        if type(block) is not Block:
            raise TypeError(f"contranorm needs timm's vision_transformer.Block, got {type(block).__name__}")
        weight = block.attn.qkv.weight
        dim = block.attn.qkv.in_features
        new = cls(dim, block.attn.num_heads, scale=scale, tau=tau, normalize=normalize, device="meta")
        for name, child in block.named_children():
            setattr(new, name, child)
        if not isinstance(new.attn, VariantAttention):
            new.attn = VanillaAttention.from_timm(new.attn)
        new.contra_norm = ContraNorm(
            dim, scale=scale, tau=tau, normalize=normalize, device=weight.device, dtype=weight.dtype
        )
        new.train(block.training)
        return new

    @classmethod
    def convert_block(cls, block: nn.Module, **kwargs: Any) -> nn.Module:
        """The ContraNorm version of ``block`` (same weights)."""
        return cls.from_timm(block, **kwargs)

    def forward(self, x: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x), attn_mask=attn_mask, is_causal=is_causal)))
        x = self.contra_norm(x)
        x = x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
        return x
