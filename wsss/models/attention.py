"""Self-attention variants against oversmoothing, as drop-in replacements inside timm ViT blocks.

Let ``A = softmax(Q K^T / sqrt(d))`` per head over the ``n`` tokens (class token included) and ``V`` the
values. The variants (``docs/design.md`` section 2):

- ``vanilla``: ``A V`` (timm's own attention).
- ``centered``: ``(A + gamma 11^T / n) V = A V + gamma * mean_tokens(V)``; rows sum to ``1 + gamma``.
- ``neutreno``: ``A V + lam (V0 - V)``, ``V0`` the values of the first NeuTRENO layer of the model.
- ``gfsa``: ``H V`` with ``H = w0 I + w1 A + wK (A + (K-1)(A^2 - A))``, learnable ``w0, w1, wK`` per head
  (initialised to 0, 1, 0, i.e. vanilla attention).
- ``contranorm``: a layer after attention + residual (:mod:`wsss.models.contranorm`).

The registry of variant names is :mod:`wsss.models.variants`.

Every attention variant subclasses timm's :class:`timm.layers.Attention` and keeps its parameter names
(``qkv``, ``q_norm``, ``k_norm``, ``norm``, ``proj``), so timm checkpoints load unchanged. Each has a fused
path built on ``F.scaled_dot_product_attention`` that never forms the ``n x n`` matrix, and an explicit
path that materialises the effective attention matrix. The explicit path runs when ``fused_attn`` is False
(timm's flag; see :func:`wsss.models.variants.set_fused_attention`) or while :func:`record_attention` is active.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from timm.layers import Attention
from torch import Tensor, nn

__all__ = [
    "CenteredAttention",
    "FirstValues",
    "GFSAAttention",
    "NeuTRENOAttention",
    "VanillaAttention",
    "VariantAttention",
    "link_first_values",
    "record_attention",
]


class VariantAttention(Attention):
    """timm's multi-head self-attention with a variant-specific mixing of the values.

    Subclasses implement :meth:`mix_fused` and :meth:`mix_explicit` on per-head tensors ``q, k, v`` of shape
    ``(B, heads, N, head_dim)``, and may add a term that is the same for every token through
    :meth:`fused_offset`. Attention masks are not supported (ViT image encoders use none).

    Args:
        dim: Token dimension.
        num_heads: Number of heads.
        **timm_kwargs: Passed to :class:`timm.layers.Attention` (``qkv_bias``, ``device``...).
    """

    config_fields: ClassVar[tuple[str, ...]] = ()
    """Names of the :class:`wsss.config.AttentionConfig` fields this variant takes as keyword arguments."""

    def __init__(self, dim: int, num_heads: int = 8, **timm_kwargs: Any) -> None:
        super().__init__(dim, num_heads=num_heads, **timm_kwargs)
        self.recorder: list[Tensor] | None = None

    @classmethod
    def from_timm(cls, attn: Attention, **kwargs: Any) -> VariantAttention:
        """The variant around the submodules (and so the weights) of an existing timm attention.

        Args:
            attn: A :class:`timm.layers.Attention` (or a variant without parameters of its own).
            **kwargs: The variant's own arguments (e.g. ``gamma``).
        """
        if not isinstance(attn, Attention):
            raise TypeError(
                f"cannot convert {type(attn).__name__} to {cls.__name__}: only timm.layers.Attention is "
                "supported (the attention of timm's VisionTransformer Block)"
            )
        if any(True for _ in attn.parameters(recurse=False)):
            raise TypeError(f"cannot convert {type(attn).__name__}: its own parameters would be lost")
        weight = attn.qkv.weight
        new = cls(
            attn.qkv.in_features,
            num_heads=attn.num_heads,
            attn_head_dim=attn.head_dim,
            dim_out=attn.proj.out_features,
            qkv_bias=attn.qkv.bias is not None,
            proj_bias=attn.proj.bias is not None,
            device=weight.device,
            dtype=weight.dtype,
            **kwargs,
        )
        for name, child in attn.named_children():
            setattr(new, name, child)
        new.fused_attn = attn.fused_attn
        new.train(attn.training)
        return new

    @classmethod
    def convert_block(cls, block: nn.Module, **kwargs: Any) -> nn.Module:
        """Replace ``block.attn`` by this variant (same weights); returns the block."""
        block.attn = cls.from_timm(block.attn, **kwargs)
        return block

    def forward(self, x: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
        """Self-attention of tokens ``x`` (B, N, dim) -> (B, N, dim_out)."""
        if attn_mask is not None or is_causal:
            raise NotImplementedError(f"{type(self).__name__} does not support attention masks")
        B, N, _ = x.shape
        gate = self.gate(x).sigmoid() if self.gate is not None else None
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        q, k = self.q_norm(q), self.k_norm(k)
        offset = None
        if self.fused_attn and self.recorder is None:
            x = self.mix_fused(q, k, v)
            offset = self.fused_offset(v)
        else:
            x, attn = self.mix_explicit(q, k, v)
            if self.recorder is not None:
                self.recorder.append(attn)
        x = x.transpose(1, 2).reshape(B, N, self.attn_dim)
        if offset is not None:
            offset = offset.transpose(1, 2).reshape(B, 1, self.attn_dim)
            if gate is not None or not isinstance(self.norm, nn.Identity):
                x, offset = x + offset, None
        x = self.norm(x)
        if gate is not None:
            x = x * gate
        x = self.proj(x)
        if offset is not None:
            # proj(x + c) = proj(x) + W c: adding the token-constant term after the projection lets proj save
            # its input as a view of the SDPA output instead of a new (B, N, D) tensor for backward.
            x = x + F.linear(offset, self.proj.weight)
        return self.proj_drop(x)

    def mix_fused(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """The attention output (B, heads, N, head_dim) through SDPA, without the n x n matrix."""
        raise NotImplementedError

    def mix_explicit(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """The attention output and the effective attention matrix (B, heads, N, N) it applies to ``v``."""
        raise NotImplementedError

    def fused_offset(self, v: Tensor) -> Tensor | None:
        """A (B, heads, 1, head_dim) term added to every token of the fused output, or None."""
        return None

    def sdpa(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """``softmax(q k^T * scale) v`` with attention dropout, by the fused kernel."""
        dropout_p = self.attn_drop.p if self.training else 0.0
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=self.scale)

    def softmax_attention(self, q: Tensor, k: Tensor) -> Tensor:
        """The materialised ``softmax(q k^T * scale)`` (B, heads, N, N), after attention dropout."""
        attn = (q * self.scale) @ k.transpose(-2, -1)
        return self.attn_drop(attn.softmax(dim=-1))


class VanillaAttention(VariantAttention):
    """timm's attention ``A V`` with the explicit path and recording of the other variants."""

    def mix_fused(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return self.sdpa(q, k, v)

    def mix_explicit(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        attn = self.softmax_attention(q, k)
        return attn @ v, attn


class CenteredAttention(VariantAttention):
    """Centered self-attention ``(A + gamma 11^T / n) V``: attention rows sum to ``1 + gamma``.

    Fused, this is ``sdpa(q, k, v) + gamma * v.mean(tokens)``: O(n d) extra work, no n x n matrix. The
    token-constant term is added after the output projection (see :meth:`VariantAttention.forward`), so
    the layer saves no more activations for backward than vanilla attention.

    Args:
        dim: Token dimension.
        num_heads: Number of heads.
        gamma: Row-sum offset; -1 (the paper) makes every row sum to 0.
        **timm_kwargs: Passed to :class:`timm.layers.Attention`.
    """

    config_fields = ("gamma",)

    def __init__(self, dim: int, num_heads: int = 8, *, gamma: float, **timm_kwargs: Any) -> None:
        super().__init__(dim, num_heads=num_heads, **timm_kwargs)
        self.gamma = float(gamma)

    def mix_fused(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return self.sdpa(q, k, v)

    def fused_offset(self, v: Tensor) -> Tensor:
        return self.gamma * v.mean(dim=-2, keepdim=True)

    def mix_explicit(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        attn = self.softmax_attention(q, k) + self.gamma / q.shape[-2]
        return attn @ v, attn

    def extra_repr(self) -> str:
        return f"gamma={self.gamma}"


class FirstValues:
    """Holder through which the first NeuTRENO layer of a model hands its values ``V0`` to the later ones.

    One instance is shared by the :class:`NeuTRENOAttention` layers of a model (:func:`link_first_values`).
    The first layer stores its values at every forward; :meth:`clear` drops them once the forward is done.
    """

    def __init__(self) -> None:
        self.values: Tensor | None = None

    def clear(self) -> None:
        self.values = None


class NeuTRENOAttention(VariantAttention):
    """NeuTRENO attention ``A V + lam (V0 - V)`` (Nguyen et al., NeurIPS 2023).

    ``V0`` are the values (per head) of the first NeuTRENO layer of the model; that layer itself computes
    plain ``A V``. Layers of one model are tied by :func:`link_first_values` (done by the backbone builder);
    a freshly built layer is its own first layer. Not compatible with activation checkpointing, which
    recomputes the layers in another order.

    Args:
        dim: Token dimension.
        num_heads: Number of heads.
        lam: Weight of ``V0 - V`` (0.6 in the paper).
        **timm_kwargs: Passed to :class:`timm.layers.Attention`.
    """

    config_fields = ("lam",)

    def __init__(self, dim: int, num_heads: int = 8, *, lam: float, **timm_kwargs: Any) -> None:
        super().__init__(dim, num_heads=num_heads, **timm_kwargs)
        self.lam = float(lam)
        self.first_values = FirstValues()
        self.is_first = True

    def value_offset(self, v: Tensor) -> Tensor | None:
        """``V0 - V``, or None in the first layer (where it is zero); the first layer stores ``V0``."""
        if self.is_first:
            self.first_values.values = v
            return None
        v0 = self.first_values.values
        if v0 is None:
            raise RuntimeError(
                "NeuTRENO layer ran before the first NeuTRENO layer of its model stored V0; run the whole "
                "backbone (wsss.models.ViTBackbone) rather than a single block"
            )
        if v0.shape != v.shape:
            raise RuntimeError(f"NeuTRENO: first-layer values {tuple(v0.shape)} != values {tuple(v.shape)}")
        return v0 - v

    def mix_fused(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        out = self.sdpa(q, k, v)
        offset = self.value_offset(v)
        return out if offset is None else out + self.lam * offset

    def mix_explicit(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """The matrix returned is the operator on this layer's values, ``A - lam I`` (first layer: ``A``).

        The output is ``(A - lam I) V + lam V0``.
        """
        attn = self.softmax_attention(q, k)
        offset = self.value_offset(v)
        if offset is None:
            return attn @ v, attn
        eye = torch.eye(attn.shape[-1], device=attn.device, dtype=attn.dtype)
        return attn @ v + self.lam * offset, attn - self.lam * eye

    def extra_repr(self) -> str:
        return f"lam={self.lam}, is_first={self.is_first}"


class GFSAAttention(VariantAttention):
    """Graph-filter self-attention (Choi et al., ICLR 2024): output ``H V`` with
    ``H = w0 I + w1 A + wK (A + (K-1)(A^2 - A))`` and learnable ``w0, w1, wK`` per head.

    Fused: ``A V`` and ``A^2 V = A (A V)`` are two SDPA calls. With attention dropout in training the explicit
    path runs instead, so that both products use one dropped ``A``. The weights start at ``w0 = 0, w1 = 1,
    wK = 0``, where the layer equals vanilla attention.

    Args:
        dim: Token dimension.
        num_heads: Number of heads.
        k: Order ``K`` of the approximated high-order term ``A^K``.
        **timm_kwargs: Passed to :class:`timm.layers.Attention`.
    """

    config_fields = ("k",)

    def __init__(self, dim: int, num_heads: int = 8, *, k: int, **timm_kwargs: Any) -> None:
        super().__init__(dim, num_heads=num_heads, **timm_kwargs)
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"gfsa: k must be an integer >= 1, got {k!r}")
        self.order = k
        factory = {"device": timm_kwargs.get("device"), "dtype": timm_kwargs.get("dtype")}
        self.w0 = nn.Parameter(torch.zeros(num_heads, **factory))
        self.w1 = nn.Parameter(torch.ones(num_heads, **factory))
        self.wk = nn.Parameter(torch.zeros(num_heads, **factory))

    def head_weights(self, dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
        """``w0, w1, wK`` shaped (1, heads, 1, 1)."""
        return tuple(w.to(dtype).view(1, -1, 1, 1) for w in (self.w0, self.w1, self.wk))

    def mix_fused(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        if self.training and self.attn_drop.p > 0:
            # A (A V) must apply one dropped A twice; two SDPA calls would draw two dropout masks.
            return self.mix_explicit(q, k, v)[0]
        w0, w1, wk = self.head_weights(v.dtype)
        av = self.sdpa(q, k, v)
        aav = self.sdpa(q, k, av)
        return w0 * v + (w1 + wk) * av + wk * (self.order - 1) * (aav - av)

    def mix_explicit(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        w0, w1, wk = self.head_weights(v.dtype)
        attn = self.softmax_attention(q, k)
        eye = torch.eye(attn.shape[-1], device=attn.device, dtype=attn.dtype)
        high = attn + (self.order - 1) * (attn @ attn - attn)
        filt = w0 * eye + w1 * attn + wk * high
        return filt @ v, filt

    def extra_repr(self) -> str:
        return f"k={self.order}"


def link_first_values(module: nn.Module) -> FirstValues | None:
    """Tie the NeuTRENO layers inside ``module`` to one :class:`FirstValues`; the first one (in module
    order, which is block order for a ViT) provides ``V0``. Returns the holder, or None without NeuTRENO."""
    layers = [m for m in module.modules() if isinstance(m, NeuTRENOAttention)]
    if not layers:
        return None
    holder = FirstValues()
    for i, layer in enumerate(layers):
        layer.first_values = holder
        layer.is_first = i == 0
    return holder


@contextmanager
def record_attention(module: nn.Module) -> Iterator[list[Tensor]]:
    """Record the effective attention matrices of every variant attention inside ``module``.

    While active, those layers run their explicit path and append their (B, heads, N, N) effective matrix
    (for ``centered``: ``A + gamma/n``) to the yielded list, in call order (block order for a ViT). The
    tensors are not detached; use ``torch.no_grad()`` for diagnostics::

        with torch.no_grad(), record_attention(model) as mats:
            model(x)

    Raises:
        ValueError: ``module`` contains no variant attention (build it with ``wsss.models.build_backbone``).
    """
    layers = [m for m in module.modules() if isinstance(m, VariantAttention)]
    if not layers:
        raise ValueError(
            f"record_attention: {type(module).__name__} contains no wsss attention variant; build the model "
            "with wsss.models.build_backbone / build_model"
        )
    mats: list[Tensor] = []
    previous = [m.recorder for m in layers]
    for m in layers:
        m.recorder = mats
    try:
        yield mats
    finally:
        for m, prev in zip(layers, previous, strict=True):
            m.recorder = prev
