from __future__ import annotations

import math

import pytest
import timm
import torch
from torch import nn

from wsss.analysis.oversmoothing import effective_rank, layer_stats, numerical_rank, token_cosine_similarity
from wsss.models.attention import CenteredAttention


def test_identical_tokens_are_fully_smoothed():
    row = torch.tensor([0.3, -1.2, 2.0, 0.5])
    tokens = torch.stack([row.expand(6, 4), 2.5 * row.expand(6, 4)])  # (2, 6, 4), all rows parallel
    torch.testing.assert_close(token_cosine_similarity(tokens), torch.ones(2))
    torch.testing.assert_close(effective_rank(tokens), torch.ones(2), atol=1e-5, rtol=0)
    assert numerical_rank(tokens).tolist() == [1, 1]


def test_orthogonal_tokens():
    eye = torch.eye(5, dtype=torch.float64)[None]
    torch.testing.assert_close(token_cosine_similarity(eye), torch.zeros(1, dtype=torch.float64))
    torch.testing.assert_close(effective_rank(eye), torch.full((1,), 5.0, dtype=torch.float64))
    assert numerical_rank(eye).tolist() == [5]
    # Orthogonal tokens of different lengths (N < D): singular values 1, 2, 3 -> not uniform.
    tokens = torch.tensor([[1.0, 0, 0, 0], [0, 2.0, 0, 0], [0, 0, 0, 3.0]])[None]
    assert token_cosine_similarity(tokens).item() == pytest.approx(0.0, abs=1e-7)
    p = [1 / 6, 2 / 6, 3 / 6]
    expected = math.exp(-sum(q * math.log(q) for q in p))
    assert effective_rank(tokens).item() == pytest.approx(expected, rel=1e-6)


def test_small_matrix_by_hand():
    # Rows (1,0), (1,1), (0,1): cos = 1/sqrt2, 0, 1/sqrt2 over the 3 pairs -> mean sqrt(2)/3.
    # X^T X = [[2,1],[1,2]] has eigenvalues 3, 1 -> singular values sqrt3, 1; ||X||_F = 2.
    x = torch.tensor([[[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]]], dtype=torch.float64)
    assert token_cosine_similarity(x).item() == pytest.approx(math.sqrt(2) / 3)
    p1, p2 = math.sqrt(3) / (math.sqrt(3) + 1), 1 / (math.sqrt(3) + 1)
    assert effective_rank(x).item() == pytest.approx(math.exp(-(p1 * math.log(p1) + p2 * math.log(p2))))
    # Relative singular values sqrt3/2 = 0.866 and 1/2 = 0.5.
    assert numerical_rank(x).item() == 2
    assert numerical_rank(x, threshold=0.6).item() == 1
    assert numerical_rank(x, threshold=0.9).item() == 0


def test_numerical_rank_threshold_is_relative_to_frobenius_norm():
    a = torch.diag(torch.tensor([1.0, 1e-4, 0.0]))
    assert numerical_rank(a).item() == 1
    assert numerical_rank(a, threshold=1e-5).item() == 2
    assert numerical_rank(1e-8 * a).item() == 1  # scale-free
    assert numerical_rank(torch.zeros(3, 3)).item() == 0
    assert effective_rank(torch.zeros(3, 3)).item() == 0.0


def test_batched_shapes_and_dtypes():
    x = torch.randn(2, 3, 5, 4)
    assert numerical_rank(x).shape == (2, 3)
    assert numerical_rank(x).dtype == torch.int64
    assert effective_rank(x).shape == (2, 3)
    assert effective_rank(x).dtype == torch.float32
    assert token_cosine_similarity(x[0]).shape == (3,)
    # Attention matrices (B, heads, N, N): uniform attention has rank 1, centring it leaves 0, and mixing
    # it with the identity gives eigenvalues 1 (on 1) and 1/2 (n - 1 times): full rank.
    uniform = torch.full((7, 7), 1 / 7)
    attn = torch.stack([uniform, uniform - 1 / 7, 0.5 * torch.eye(7) + 0.5 * uniform]).expand(2, 3, 7, 7)
    assert numerical_rank(attn).tolist() == [[1, 0, 7], [1, 0, 7]]
    with pytest.raises(ValueError, match="at least 2 tokens"):
        token_cosine_similarity(torch.randn(1, 1, 4))


def tiny_vit() -> nn.Module:
    torch.manual_seed(0)
    return timm.create_model(
        "vit_tiny_patch16_224",
        pretrained=False,
        img_size=32,
        patch_size=8,
        embed_dim=24,
        depth=3,
        num_heads=2,
        num_classes=0,
    ).eval()


def reference_stats(vit: nn.Module, images: torch.Tensor) -> list[dict]:
    """Block-by-block forward with the attention matrices recomputed from each block's qkv weights."""
    rows = []
    with torch.no_grad():
        x = vit.norm_pre(vit.patch_drop(vit._pos_embed(vit.patch_embed(images))))
        for i, block in enumerate(vit.blocks):
            attn_rank = None
            if isinstance(block.attn, CenteredAttention):
                a = block.attn
                b, n, c = x.shape
                qkv = a.qkv(block.norm1(x)).reshape(b, n, 3, a.num_heads, a.head_dim).permute(2, 0, 3, 1, 4)
                q, k = qkv[0], qkv[1]
                mat = torch.softmax(q @ k.transpose(-2, -1) * a.scale, dim=-1) + a.gamma / n
                attn_rank = numerical_rank(mat).double().mean().item()
            x = block(x)
            patch = x[:, vit.num_prefix_tokens :]
            rows.append(
                {
                    "layer": i,
                    "cosine": token_cosine_similarity(patch).double().mean().item(),
                    "effective_rank": effective_rank(patch).double().mean().item(),
                    "attn_numerical_rank": attn_rank,
                }
            )
    return rows


def assert_rows_close(rows: list[dict], expected: list[dict]) -> None:
    assert [r["layer"] for r in rows] == [e["layer"] for e in expected]
    for r, e in zip(rows, expected, strict=True):
        assert r["cosine"] == pytest.approx(e["cosine"], abs=1e-5)
        assert r["effective_rank"] == pytest.approx(e["effective_rank"], rel=1e-5)
        if e["attn_numerical_rank"] is None:
            assert r["attn_numerical_rank"] is None
        else:
            assert r["attn_numerical_rank"] == pytest.approx(e["attn_numerical_rank"])


def test_layer_stats_plain_timm_vit_has_token_stats_only():
    vit = tiny_vit()
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    rows = layer_stats(vit, images)
    assert len(rows) == 3
    assert_rows_close(rows, reference_stats(vit, images))
    assert all(r["attn_numerical_rank"] is None for r in rows)
    assert all(1.0 <= r["effective_rank"] <= 16.0 for r in rows)  # 16 patch tokens


def test_layer_stats_records_variant_attention_per_block():
    vit = tiny_vit()
    CenteredAttention.convert_block(vit.blocks[0], gamma=-1.0)
    CenteredAttention.convert_block(vit.blocks[2], gamma=0.5)
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    expected = reference_stats(vit, images)
    assert [e["attn_numerical_rank"] is None for e in expected] == [False, True, False]

    rows = layer_stats(vit, images)
    assert_rows_close(rows, expected)
    # gamma = -1 rows sum to 0: the all-ones vector is in the kernel, so the 17 x 17 matrix has rank <= 16.
    assert rows[0]["attn_numerical_rank"] <= 16

    class Segmentor(nn.Module):
        def __init__(self, backbone: nn.Module) -> None:
            super().__init__()
            self.backbone = backbone

    assert_rows_close(layer_stats(Segmentor(vit), images), expected)


def test_layer_stats_rejects_non_vit():
    with pytest.raises(TypeError, match="timm ViT"):
        layer_stats(nn.Linear(3, 3), torch.randn(1, 3, 8, 8))
