"""Attention variants: fused == explicit, brute-force references, neutral settings == timm."""

from __future__ import annotations

import copy
import math

import pytest
import timm
import torch
import torch.nn.functional as F
from timm.layers import Attention
from timm.models.vision_transformer import Block
from torch import nn

from wsss.config import AttentionConfig
from wsss.models import (
    ATTENTION_VARIANTS,
    CenteredAttention,
    ContraNorm,
    ContraNormBlock,
    GFSAAttention,
    NeuTRENOAttention,
    VanillaAttention,
    attention_args,
    build_attention,
    build_backbone,
    record_attention,
    set_fused_attention,
)

TINY_NAME = "vit_tiny_patch16_224"
TINY = {"embed_dim": 64, "depth": 4, "num_heads": 4}


def tiny_backbone(name: str, seed: int = 0, **attention):
    """A 4-block, 64-dim ViT with variant ``name``; the same seed gives the same timm weights."""
    torch.manual_seed(seed)
    cfg = AttentionConfig(name=name, **attention)
    return build_backbone(TINY_NAME, backbone_kwargs=TINY, **attention_args(cfg)).eval()


def images(b: int = 2, h: int = 48, w: int = 64, seed: int = 1) -> torch.Tensor:
    return torch.randn(b, 3, h, w, generator=torch.Generator().manual_seed(seed))


def split_heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, N, heads * d) -> (B, heads, N, d)."""
    B, N, _ = t.shape
    return t.reshape(B, N, heads, -1).transpose(1, 2)


def reference_qkv(attn: Attention, x: torch.Tensor):
    """q, k, v (B, heads, N, d) computed by hand from the qkv weights."""
    qkv = x @ attn.qkv.weight.T + attn.qkv.bias
    q, k, v = qkv.chunk(3, dim=-1)
    return (split_heads(t, attn.num_heads) for t in (q, k, v))


def reference_out(attn: Attention, mixed: torch.Tensor) -> torch.Tensor:
    """Merge heads (B, heads, N, d) -> (B, N, D) and apply the output projection."""
    B, H, N, d = mixed.shape
    return mixed.transpose(1, 2).reshape(B, N, H * d) @ attn.proj.weight.T + attn.proj.bias


@pytest.mark.parametrize("name", list(ATTENTION_VARIANTS))
def test_fused_matches_explicit_in_a_model(name):
    model = tiny_backbone(name, scale=0.3, tau=0.5)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, GFSAAttention):  # away from the vanilla init so every term counts
                for w in (m.w0, m.w1, m.wk):
                    w.copy_(torch.randn_like(w) * 0.5)
    x = images()

    def run():
        model.zero_grad()
        out = model(x, [1])
        (out.features.square().mean() + out.intermediates[0].mean()).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        return out.features.detach(), out.intermediates[0].detach(), grads

    fused = run()
    assert set_fused_attention(model, False) >= TINY["depth"]
    explicit = run()
    torch.testing.assert_close(explicit[0], fused[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(explicit[1], fused[1], atol=1e-5, rtol=0)
    for n, g in fused[2].items():
        torch.testing.assert_close(explicit[2][n], g, atol=1e-5, rtol=1e-4, msg=n)


@pytest.mark.parametrize("scale_norm", [False, True])
@pytest.mark.parametrize("gamma", [-1.0, -0.7, 0.5])
def test_centered_matches_brute_force(gamma, scale_norm):
    """Also with a norm before the projection, where the offset cannot be folded through it."""
    torch.manual_seed(0)
    attn = build_attention(
        "centered", dim=32, num_heads=4, qkv_bias=True, gamma=gamma, scale_norm=scale_norm, norm_layer=nn.LayerNorm
    ).eval()
    x = torch.randn(2, 11, 32)
    q, k, v = reference_qkv(attn, x)
    n, d = x.shape[1], q.shape[-1]
    a = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d), dim=-1) + gamma * torch.ones(n, n) / n
    mixed = (a @ v).transpose(1, 2).reshape(2, n, 32)
    if scale_norm:
        mixed = F.layer_norm(mixed, (32,), attn.norm.weight, attn.norm.bias, attn.norm.eps)
    expected = mixed @ attn.proj.weight.T + attn.proj.bias
    with torch.no_grad():
        torch.testing.assert_close(attn(x), expected, atol=1e-5, rtol=0)
        attn.fused_attn = False
        torch.testing.assert_close(attn(x), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize(("name", "gamma"), [("centered", -1.0), ("centered", 0.5), ("vanilla", 0.0)])
def test_recorded_rows_sum_to_one_plus_gamma(name, gamma):
    model = tiny_backbone(name, gamma=gamma)
    x = images(h=32, w=48)
    n = 1 + 2 * 3
    with torch.no_grad(), record_attention(model) as mats:
        model(x)
    assert len(mats) == TINY["depth"]
    for a in mats:
        assert a.shape == (2, TINY["num_heads"], n, n)
        rows = torch.full((2, TINY["num_heads"], n), 1.0 + gamma)
        torch.testing.assert_close(a.sum(-1), rows, atol=1e-5, rtol=0)
    if name == "centered":  # the softmax part is positive, so every entry exceeds gamma / n
        assert all(bool((a > gamma / n).all()) for a in mats)
    assert all(m.recorder is None for m in model.modules() if hasattr(m, "recorder"))


def test_record_attention_only_in_recorded_blocks_and_needs_variants():
    model = tiny_backbone("centered", blocks=[0, -1])
    with torch.no_grad(), record_attention(model) as mats:
        model(images())
    assert len(mats) == 2
    plain = timm.create_model(TINY_NAME, pretrained=False, num_classes=0, **TINY)
    with pytest.raises(ValueError, match="no wsss attention variant"):
        with record_attention(plain):
            pass


def test_vanilla_equals_timm_fused_and_explicit():
    torch.manual_seed(0)
    ref = timm.create_model(TINY_NAME, pretrained=False, num_classes=0, dynamic_img_size=True, **TINY).eval()
    model = tiny_backbone("vanilla")
    model.vit.load_state_dict(ref.state_dict())
    x = images()
    with torch.no_grad():
        expected = model.token_map(ref.forward_features(x), x.shape[-2:])
        torch.testing.assert_close(model(x).features, expected, atol=1e-5, rtol=0)
        set_fused_attention(model, False)
        torch.testing.assert_close(model(x).features, expected, atol=1e-5, rtol=0)


def test_gfsa_at_init_equals_vanilla_and_learns_per_head_weights():
    vanilla, gfsa = tiny_backbone("vanilla"), tiny_backbone("gfsa", k=4)
    x = images()
    with torch.no_grad():
        torch.testing.assert_close(gfsa(x).features, vanilla(x).features, atol=1e-5, rtol=0)
    layer = gfsa.vit.blocks[2].attn
    assert isinstance(layer, GFSAAttention) and layer.order == 4
    assert layer.w0.shape == layer.w1.shape == layer.wk.shape == (TINY["num_heads"],)
    gfsa.train()
    gfsa(x).features.square().mean().backward()
    for w in (layer.w0, layer.w1, layer.wk):
        assert w.grad is not None and bool((w.grad != 0).all())


@pytest.mark.parametrize("order", [2, 3, 5])
@pytest.mark.parametrize("fused", [True, False])
def test_gfsa_matches_brute_force_with_trained_weights(order, fused):
    """``H = w0 I + w1 A + wK (A + (K-1)(A^2 - A))`` built by hand, per head, with weights away from the init."""
    torch.manual_seed(0)
    attn = build_attention("gfsa", dim=32, num_heads=4, qkv_bias=True, k=order).eval()
    with torch.no_grad():
        for w in (attn.w0, attn.w1, attn.wk):
            w.copy_(torch.randn_like(w))
    attn.fused_attn = fused
    x = torch.randn(2, 9, 32)
    q, k, v = reference_qkv(attn, x)
    a = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
    eye = torch.eye(9)
    mixed = torch.empty_like(v)
    for h in range(4):
        w0, w1, wk = attn.w0[h], attn.w1[h], attn.wk[h]
        ah = a[:, h]
        high = ah + (order - 1) * (ah @ ah - ah)
        mixed[:, h] = (w0 * eye + w1 * ah + wk * high) @ v[:, h]
    with torch.no_grad():
        torch.testing.assert_close(attn(x), reference_out(attn, mixed), atol=1e-5, rtol=0)


def test_gfsa_attention_dropout_uses_one_mask():
    """Under attention dropout ``A (A V)`` must reuse one dropped ``A``: the fused path equals the explicit one."""
    attn = build_attention("gfsa", dim=32, num_heads=4, qkv_bias=True, k=3, attn_drop=0.5).train()
    with torch.no_grad():
        attn.wk.fill_(0.7)
    x = torch.randn(2, 9, 32)
    torch.manual_seed(5)
    fused = attn(x)
    attn.fused_attn = False
    torch.manual_seed(5)
    explicit = attn(x)
    torch.testing.assert_close(fused, explicit, atol=1e-6, rtol=0)


def test_neutreno_lambda_zero_equals_vanilla():
    vanilla, neutreno = tiny_backbone("vanilla"), tiny_backbone("neutreno", lam=0.0)
    x = images()
    with torch.no_grad():
        torch.testing.assert_close(neutreno(x).features, vanilla(x).features, atol=1e-5, rtol=0)
        assert not torch.allclose(tiny_backbone("neutreno", lam=0.6)(x).features, vanilla(x).features)


@pytest.mark.parametrize("fused", [True, False])
def test_neutreno_uses_values_of_first_variant_block(fused):
    lam = 0.6
    model = tiny_backbone("neutreno", lam=lam, blocks=[1, 3])
    set_fused_attention(model, fused)
    attn1, attn3 = model.vit.blocks[1].attn, model.vit.blocks[3].attn
    assert isinstance(attn1, NeuTRENOAttention) and attn1.is_first and not attn3.is_first
    assert type(model.vit.blocks[0].attn) is Attention and type(model.vit.blocks[2].attn) is Attention
    seen = {}
    hooks = [
        blk.attn.register_forward_hook(lambda m, args, out, i=i: seen.__setitem__(i, (args[0], out)))
        for i, blk in enumerate(model.vit.blocks)
        if i in (1, 3)
    ]
    with torch.no_grad():
        model(images())
        x1, out1 = seen[1]
        x3, out3 = seen[3]
        q1, k1, v1 = reference_qkv(attn1, x1)
        a1 = torch.softmax(q1 @ k1.transpose(-2, -1) * attn1.scale, -1)
        torch.testing.assert_close(out1, reference_out(attn1, a1 @ v1), atol=1e-5, rtol=0)
        q3, k3, v3 = reference_qkv(attn3, x3)
        a3 = torch.softmax(q3 @ k3.transpose(-2, -1) * attn3.scale, -1)
        expected = reference_out(attn3, a3 @ v3 + lam * (v1 - v3))
        torch.testing.assert_close(out3, expected, atol=1e-5, rtol=0)
    for h in hooks:
        h.remove()
    assert model.first_values is not None and model.first_values.values is None


def test_neutreno_layer_alone_is_its_own_first_layer():
    torch.manual_seed(0)
    neutreno = build_attention("neutreno", dim=32, num_heads=4, lam=0.6).eval()
    vanilla = VanillaAttention(32, num_heads=4).eval()
    vanilla.load_state_dict(neutreno.state_dict())
    x = torch.randn(2, 7, 32)
    with torch.no_grad():
        torch.testing.assert_close(neutreno(x), vanilla(x), atol=1e-6, rtol=0)


def timm_block(dim: int = 32, heads: int = 4) -> Block:
    torch.manual_seed(0)
    block = Block(dim, heads, qkv_bias=True).eval()
    with torch.no_grad():  # non-trivial norms so that a dropped LayerNorm would show
        for norm in (block.norm1, block.norm2):
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.normal_()
    return block


def test_contranorm_scale_zero_is_layernorm_of_block_output():
    block = timm_block()
    cn = ContraNormBlock.from_timm(copy.deepcopy(block), scale=0.0, tau=1.0, normalize=True)
    x = torch.randn(2, 9, 32) * 3
    with torch.no_grad():
        h = x + block.attn(block.norm1(x))
        h = F.layer_norm(h, (32,), eps=1e-6)
        expected = h + block.mlp(block.norm2(h))
        torch.testing.assert_close(cn(x), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("fused", [True, False])
def test_contranorm_block_matches_formula(fused):
    s, tau = 0.2, 0.5
    block = timm_block()
    cn = ContraNormBlock.from_timm(copy.deepcopy(block), scale=s, tau=tau, normalize=True)
    set_fused_attention(cn, fused)
    x = torch.randn(2, 9, 32) * 3
    with torch.no_grad():
        h = x + block.attn(block.norm1(x))
        hn = h / h.norm(dim=-1, keepdim=True)
        sim = torch.softmax(hn @ hn.transpose(-2, -1) / tau, dim=-1)
        h = F.layer_norm(h - s / tau * (sim @ h), (32,), eps=1e-6)
        expected = h + block.mlp(block.norm2(h))
        torch.testing.assert_close(cn(x), expected, atol=1e-5, rtol=0)


def test_contranorm_unnormalised_is_the_papers_formula():
    layer = ContraNorm(16, scale=0.3, tau=2.0, normalize=False)
    x = torch.randn(3, 5, 16)
    sim = torch.softmax(x @ x.transpose(-2, -1) / 2.0, dim=-1)
    expected = F.layer_norm(x - 0.3 / 2.0 * (sim @ x), (16,), eps=1e-6)
    torch.testing.assert_close(layer(x), expected, atol=1e-5, rtol=0)
    layer.fused_attn = False
    torch.testing.assert_close(layer(x), expected, atol=1e-5, rtol=0)


def test_build_attention_error_lists_valid_names():
    with pytest.raises(ValueError) as err:
        build_attention("centred", dim=32, num_heads=4)
    for name in ("vanilla", "centered", "neutreno", "gfsa", "contranorm"):
        assert name in str(err.value)


def test_build_attention_gives_timm_modules():
    centered = build_attention("centered", dim=32, num_heads=4, gamma=-0.5)
    assert isinstance(centered, CenteredAttention) and isinstance(centered, Attention)
    assert centered.gamma == -0.5
    assert isinstance(build_attention("contranorm", dim=32, num_heads=4, scale=0.2, tau=1.0, normalize=True), Block)
    with pytest.raises(ValueError, match="k must be"):
        build_attention("gfsa", dim=32, num_heads=4, k=0)


@pytest.mark.parametrize("name", ["vanilla", "centered", "neutreno", "gfsa"])
def test_from_timm_keeps_parameter_names_and_weights(name):
    torch.manual_seed(0)
    attn = Attention(32, num_heads=4, qkv_bias=True)
    kwargs = {"centered": {"gamma": -1.0}, "neutreno": {"lam": 0.6}, "gfsa": {"k": 3}}.get(name, {})
    converted = ATTENTION_VARIANTS[name].from_timm(attn, **kwargs)
    own = attn.state_dict()
    new = converted.state_dict()
    extra = {"w0", "w1", "wk"} if name == "gfsa" else set()
    assert set(new) == set(own) | extra
    for key, value in own.items():
        assert torch.equal(new[key], value)
    converted.load_state_dict(new, strict=True)
