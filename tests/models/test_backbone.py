"""Backbone: timm checkpoints load strictly into every variant, outputs equal timm's, block selection."""

from __future__ import annotations

import re

import pytest
import timm
import torch
import torch.nn.functional as F
from timm.layers import Attention, resample_abs_pos_embed

from wsss.config import AttentionConfig, ModelConfig
from wsss.models import (
    ATTENTION_VARIANTS,
    ContraNormBlock,
    NeuTRENOAttention,
    VariantAttention,
    attention_args,
    build_backbone,
    resolve_block_indices,
)
from wsss.models.builder import build_model_backbone

DEIT = "deit_small_patch16_224"
TINY_NAME = "vit_tiny_patch16_224"
TINY = {"embed_dim": 64, "depth": 4, "num_heads": 4}


@pytest.fixture(scope="module")
def deit_checkpoint(tmp_path_factory):
    """A randomly initialised timm DeiT-S (with its 1000-class head) and its state_dict saved to a file."""
    torch.manual_seed(0)
    model = timm.create_model(DEIT, pretrained=False).eval()
    path = tmp_path_factory.mktemp("ckpt") / "deit_small.pth"
    torch.save(model.state_dict(), path)
    return path, model


def tiny_state_dict(seed: int = 0, **kwargs) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return timm.create_model(TINY_NAME, pretrained=False, **{**TINY, **kwargs}).state_dict()


def test_local_checkpoint_gives_timm_outputs(deit_checkpoint):
    path, ref = deit_checkpoint
    torch.manual_seed(123)  # a different random init, overwritten by the checkpoint
    backbone = build_backbone(DEIT, pretrained=str(path), attention="vanilla").eval()
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = backbone(x, [-3])
        expected = backbone.token_map(ref.forward_features(x), (224, 224))
        _, (expected_aux,) = ref.forward_intermediates(x, [9])
    assert out.features.shape == (1, 384, 14, 14)
    torch.testing.assert_close(out.features, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.intermediates[0], expected_aux, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", list(ATTENTION_VARIANTS))
def test_checkpoint_loads_into_every_variant(deit_checkpoint, name):
    path, ref = deit_checkpoint
    backbone = build_backbone(DEIT, pretrained=str(path), **attention_args(AttentionConfig(name=name)))
    expected = {k: v for k, v in ref.state_dict().items() if not k.startswith("head.")}
    got = backbone.vit.state_dict()
    for key, value in expected.items():
        assert torch.equal(got[key], value), key
    extra = set(got) - set(expected)
    depth = len(backbone.vit.blocks)
    neutral = {
        "vanilla": {},
        "centered": {},
        "neutreno": {},
        "gfsa": {f"blocks.{i}.attn.{w}": float(w == "w1") for i in range(depth) for w in ("w0", "w1", "wk")},
        "contranorm": {
            f"blocks.{i}.contra_norm.norm.{p}": float(p == "weight") for i in range(depth) for p in ("weight", "bias")
        },
    }[name]
    assert extra == set(neutral)
    for key, fill in neutral.items():
        assert bool((got[key] == fill).all()), key
    assert all(
        isinstance(b.attn, ATTENTION_VARIANTS[name] if name != "contranorm" else VariantAttention)
        for b in backbone.vit.blocks
    )


@pytest.mark.parametrize("wrap", ["plain", "model", "state_dict", "ddp"])
def test_checkpoint_wrappers(tmp_path, wrap):
    sd = tiny_state_dict(seed=5)
    obj = {
        "plain": sd,
        "model": {"model": sd, "step": 3},
        "state_dict": {"state_dict": sd},
        "ddp": {f"module.{k}": v for k, v in sd.items()},
    }[wrap]
    path = tmp_path / "w.pt"
    torch.save(obj, path)
    backbone = build_backbone(TINY_NAME, str(path), "gfsa", attention_kwargs={"k": 3}, backbone_kwargs=TINY)
    for key, value in sd.items():
        if not key.startswith("head."):
            assert torch.equal(backbone.vit.state_dict()[key], value), key


def test_position_embedding_resized_like_timm(tmp_path):
    torch.manual_seed(0)
    ref = timm.create_model(TINY_NAME, pretrained=False, num_classes=0, img_size=64, dynamic_img_size=True, **TINY)
    path = tmp_path / "grid4.pt"
    torch.save(ref.state_dict(), path)
    backbone = build_backbone(TINY_NAME, str(path), "vanilla", backbone_kwargs={**TINY, "img_size": 96}).eval()
    pos = backbone.vit.pos_embed
    assert pos.shape == (1, 1 + 6 * 6, 64)
    expected = resample_abs_pos_embed(ref.pos_embed, new_size=(6, 6), old_size=(4, 4), num_prefix_tokens=1)
    torch.testing.assert_close(pos, expected)
    x = torch.randn(2, 3, 96, 96)
    with torch.no_grad():  # timm resamples the 4x4 grid at run time the same way
        torch.testing.assert_close(
            backbone(x).features,
            backbone.token_map(ref.eval().forward_features(x), (96, 96)),
            atol=1e-5,
            rtol=0,
        )


def test_missing_checkpoint_error_names_the_path(tmp_path):
    path = tmp_path / "nowhere" / "deit.pth"
    with pytest.raises(FileNotFoundError, match=re.escape(str(path))) as err:
        build_backbone(TINY_NAME, str(path), backbone_kwargs=TINY)
    assert "model.pretrained" in str(err.value)


def test_incompatible_checkpoints_error_names_the_path(tmp_path):
    cases = {
        "shape.pt": tiny_state_dict(embed_dim=32),
        "extra.pt": {**tiny_state_dict(), "blocks.0.attn.w0": torch.zeros(4)},
        "missing.pt": {k: v for k, v in tiny_state_dict().items() if k != "cls_token"},
        "list.pt": [1, 2, 3],
    }
    for filename, obj in cases.items():
        path = tmp_path / filename
        torch.save(obj, path)
        with pytest.raises(ValueError, match=re.escape(str(path))):
            build_backbone(TINY_NAME, str(path), backbone_kwargs=TINY)
    (tmp_path / "text.pt").write_text("not a checkpoint")
    with pytest.raises(ValueError, match="text.pt"):
        build_backbone(TINY_NAME, str(tmp_path / "text.pt"), backbone_kwargs=TINY)


def test_hub_weights_requested_from_timm(monkeypatch):
    calls = []
    real = timm.create_model

    def fake(name, pretrained=False, **kwargs):
        calls.append((name, pretrained, kwargs))
        if pretrained:
            name = name.split(".")[0]
        return real(name, pretrained=False, **kwargs)

    monkeypatch.setattr(timm, "create_model", fake)
    build_backbone(TINY_NAME, "hub:augreg_in21k", backbone_kwargs=TINY, drop_path_rate=0.1)
    build_backbone(TINY_NAME, "hub", backbone_kwargs=TINY)
    assert [c[:2] for c in calls] == [(f"{TINY_NAME}.augreg_in21k", True), (TINY_NAME, True)]
    kwargs = calls[0][2]
    assert kwargs["num_classes"] == 0 and kwargs["dynamic_img_size"] and kwargs["drop_path_rate"] == 0.1

    def offline(name, pretrained=False, **kwargs):
        raise OSError("no network")

    monkeypatch.setattr(timm, "create_model", offline)
    with pytest.raises(RuntimeError, match="torch.save"):
        build_backbone(TINY_NAME, "hub", backbone_kwargs=TINY)


def test_variant_only_in_selected_blocks():
    backbone = build_backbone(
        TINY_NAME, backbone_kwargs=TINY, **attention_args(AttentionConfig(name="contranorm", blocks=[0, -1]))
    )
    kinds = [type(b).__name__ for b in backbone.vit.blocks]
    assert kinds == ["ContraNormBlock", "Block", "Block", "ContraNormBlock"]
    assert isinstance(backbone.vit.blocks[0], ContraNormBlock)
    assert type(backbone.vit.blocks[1].attn) is Attention
    assert resolve_block_indices(None, 4) == [0, 1, 2, 3]
    assert resolve_block_indices([-1, 1], 4) == [1, 3]
    with pytest.raises(IndexError, match="out of range"):
        resolve_block_indices([4], 4)
    with pytest.raises(ValueError, match="twice"):
        resolve_block_indices([1, -3], 4)


def test_drop_path_rate_and_backbone_kwargs_reach_timm():
    backbone = build_backbone(TINY_NAME, drop_path_rate=0.3, backbone_kwargs={**TINY, "qkv_bias": False})
    assert backbone.vit.blocks[-1].drop_path1.drop_prob == pytest.approx(0.3)
    assert backbone.vit.blocks[0].attn.qkv.bias is None
    assert backbone.depth == 4 and backbone.embed_dim == 64 and backbone.patch_size == 16
    assert backbone.data_config["mean"] == pytest.approx((0.5, 0.5, 0.5))


def test_early_stop_and_neutreno_values_released():
    torch.manual_seed(0)
    neutreno = attention_args(AttentionConfig(name="neutreno"))
    backbone = build_backbone(TINY_NAME, backbone_kwargs=TINY, **neutreno).eval()
    assert isinstance(backbone.vit.blocks[0].attn, NeuTRENOAttention)
    x = torch.randn(1, 3, 32, 48)
    with torch.no_grad():
        full = backbone(x, [1, -1])
        early = backbone(x, [1], stop_early=True)
    assert early.features is None and backbone.first_values.values is None
    torch.testing.assert_close(early.intermediates[0], full.intermediates[0])
    assert [t.shape for t in full.intermediates] == [(1, 64, 2, 3)] * 2
    with pytest.raises(IndexError):
        backbone(x, [4])


def test_contranorm_normalize_comes_from_the_config():
    from wsss.config import AttentionConfig
    from wsss.models.backbone import build_backbone

    for normalize in (True, False):
        cfg = AttentionConfig(name="contranorm", normalize=normalize)
        backbone = build_backbone("vit_tiny_patch16_224", backbone_kwargs={"depth": 2}, **attention_args(cfg))
        assert all(block.contra_norm.normalize is normalize for block in backbone.vit.blocks)


@pytest.mark.parametrize(
    "name",
    ["swin_tiny_patch4_window7_224", "convnext_tiny", "vit_relpos_small_patch16_224", "naflexvit_base_patch16_gap",
     "eva02_small_patch14_224"],
)  # fmt: skip
def test_other_architectures_get_the_project_error(name):
    with pytest.raises(ValueError, match=f"model.backbone '{name}' is a timm .*needs a timm VisionTransformer"):
        build_backbone(name, backbone_kwargs={"depth": 1})


def test_position_embedding_resampling_is_the_references_by_default():
    """At a 448 input the 14 x 14 grid becomes 28 x 28 by plain bicubic (align_corners=False, no antialias), as the
    reference resamples; ``timm`` keeps timm's antialiased kernel, which differs."""
    torch.manual_seed(0)
    cfg = ModelConfig(backbone=TINY_NAME, pretrained="", backbone_kwargs=TINY, attention=AttentionConfig("vanilla"))
    assert cfg.pos_embed_interp == "bicubic"
    ours = build_model_backbone(cfg).eval()
    timms = build_backbone(TINY_NAME, backbone_kwargs=TINY, pos_embed_interp="timm").eval()
    timms.load_state_dict(ours.state_dict())
    stored = ours.vit.pos_embed.detach()
    grid = stored[:, 1:].reshape(1, 14, 14, -1).permute(0, 3, 1, 2)
    want = F.interpolate(grid, size=(28, 28), mode="bicubic", align_corners=False).permute(0, 2, 3, 1).flatten(1, 2)
    zeros = torch.zeros(1, 28, 28, TINY["embed_dim"])
    with torch.no_grad():
        got, got_timm = ours.vit._pos_embed(zeros), timms.vit._pos_embed(zeros)
    torch.testing.assert_close(got[:, 1:], want, rtol=0, atol=0)
    torch.testing.assert_close(got[:, :1], ours.vit.cls_token + stored[:, :1], rtol=0, atol=0)
    antialiased = resample_abs_pos_embed(stored, new_size=[28, 28], num_prefix_tokens=1)
    torch.testing.assert_close(got_timm[:, 1:], antialiased[:, 1:], rtol=0, atol=0)
    assert (got_timm[:, 1:] - want).abs().max() > 1e-3  # a different kernel
    x = torch.randn(1, 3, 448, 448)
    with torch.no_grad():
        assert not torch.allclose(ours(x).features, timms(x).features)
        x224 = x[..., :224, :224]  # the stored grid: no resampling, both equal
        torch.testing.assert_close(ours(x224).features, timms(x224).features, rtol=0, atol=0)
        assert torch.equal(timms(x).features, timms.vit.forward_features(x)[:, 1:].mT.reshape(1, -1, 28, 28))


def test_a_backbone_without_class_position_embedding_runs_with_the_default_resampling():
    """timm's deit3 (``no_embed_class``: the position embedding covers the patch tokens only, the class token gets
    none) builds from the config alone and runs at any size with ``bicubic``, the default: the grid resampled by
    plain bicubic, added to the patch tokens before the class token is prepended; at 224 it is timm's model."""
    torch.manual_seed(0)
    name, kwargs = "deit3_small_patch16_224", {"depth": 2}
    cfg = ModelConfig(backbone=name, pretrained="", backbone_kwargs=kwargs, attention=AttentionConfig("vanilla"))
    assert cfg.pos_embed_interp == "bicubic"
    ours = build_model_backbone(cfg).eval()
    assert ours.vit.no_embed_class and ours.vit.pos_embed.shape == (1, 14 * 14, 384)
    stored = ours.vit.pos_embed.detach()
    grid = stored.reshape(1, 14, 14, -1).permute(0, 3, 1, 2)
    want = F.interpolate(grid, size=(10, 12), mode="bicubic", align_corners=False).permute(0, 2, 3, 1).flatten(1, 2)
    tokens = torch.randn(1, 10, 12, 384)
    with torch.no_grad():
        got = ours.vit._pos_embed(tokens)
    torch.testing.assert_close(got[:, 1:], tokens.flatten(1, 2) + want, rtol=0, atol=1e-6)
    torch.testing.assert_close(got[:, :1], ours.vit.cls_token, rtol=0, atol=0)  # no position for the class token
    ref = timm.create_model(name, pretrained=False, num_classes=0, **kwargs).eval()
    ref.load_state_dict(ours.vit.state_dict())
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(ours(x).features, ours.token_map(ref.forward_features(x), (224, 224)),
                                   rtol=0, atol=1e-5)  # fmt: skip
        assert ours(torch.randn(2, 3, 160, 190)).features.shape == (2, 384, 10, 12)


def test_a_frozen_position_embedding_is_resampled_once_per_grid_and_again_when_it_changes():
    """The reference's bicubic grid is kept while the embedding is frozen and unchanged (one CUDA bicubic call per
    grid instead of three per training step); loading other weights into it, or training it, resamples."""
    torch.manual_seed(0)
    cfg = ModelConfig(backbone=TINY_NAME, pretrained="", backbone_kwargs=TINY, attention=AttentionConfig("vanilla"))
    backbone = build_model_backbone(cfg)
    vit = backbone.vit
    assert not vit.pos_embed.requires_grad  # model.freeze_pos_embed, the default
    zeros = torch.zeros(1, 28, 28, TINY["embed_dim"])

    def expected():
        grid = vit.pos_embed.detach()[:, 1:].reshape(1, 14, 14, -1).permute(0, 3, 1, 2)
        return F.interpolate(grid, size=(28, 28), mode="bicubic", align_corners=False).permute(0, 2, 3, 1).flatten(1, 2)

    first = vit._pos_embed(zeros)
    assert torch.equal(first[:, 1:], expected())
    held = vit._frozen_grids[(28, 28)][2]
    vit._pos_embed(zeros)
    assert vit._frozen_grids[(28, 28)][2] is held  # reused, not resampled
    with torch.no_grad():
        vit.pos_embed.mul_(2.0)  # written in place, as load_state_dict does
    assert torch.equal(vit._pos_embed(zeros)[:, 1:], expected())
    for size in range(1, 12):  # many image sizes: only the newest few grids are kept
        vit._pos_embed(torch.zeros(1, size, size, TINY["embed_dim"]))
    assert len(vit._frozen_grids) == 8 and (28, 28) not in vit._frozen_grids
    vit.pos_embed.requires_grad_(True)  # trained: resampled at every call, with its gradient
    vit._pos_embed(zeros).sum().backward()
    assert vit.pos_embed.grad is not None and vit.pos_embed.grad.abs().sum() > 0
