"""WSSSModel: output shapes for several input sizes, CAM = classifier per token, aux tokens, param groups."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from wsss.config import AttentionConfig, ModelConfig
from wsss.models import ModelOutput, WSSSModel, build_model, resize_to_image

TINY_NAME = "vit_tiny_patch16_224"
TINY = {"embed_dim": 64, "depth": 4, "num_heads": 4}


def tiny_model(num_classes: int = 5, name: str = "centered", **cfg) -> WSSSModel:
    torch.manual_seed(0)
    config = ModelConfig(
        backbone=TINY_NAME,
        backbone_kwargs=TINY,
        pretrained="",
        drop_path_rate=0.0,
        attention=AttentionConfig(name=name),
        decoder_channels=32,
        **cfg,
    )
    return build_model(config, num_classes).eval()


@pytest.mark.parametrize(("h", "w"), [(448, 448), (320, 480), (224, 224)])
def test_output_shapes(h, w):
    model = tiny_model(num_classes=21)
    x = torch.randn(1, 3, h, w)
    with torch.no_grad():
        out = model(x)
        cam = model.cam(x)
        aux_cam = model.cam(x, aux=True)
    gh, gw = h // 16, w // 16
    assert isinstance(out, ModelOutput)
    assert out.logits.shape == out.aux_logits.shape == (1, 20)
    assert out.seg.shape == (1, 21, gh, gw)
    assert out.features.shape == out.aux_features.shape == (1, 64, gh, gw)
    assert cam.shape == aux_cam.shape == (1, 20, gh, gw)
    assert model.stride == 16


def test_deit_small_default_config_shapes():
    torch.manual_seed(0)
    model = build_model(ModelConfig(pretrained=""), num_classes=21).eval()
    assert len(model.backbone.vit.blocks) == 12 and model.aux_layer == 9
    assert type(model.backbone.vit.blocks[0].attn).__name__ == "CenteredAttention"
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        out = model(x)
    assert out.logits.shape == (1, 20) and out.seg.shape == (1, 21, 14, 14)
    assert out.features.shape == (1, 384, 14, 14)
    assert model.decoder.conv1.dilation == (5, 5) and model.decoder.conv1.out_channels == 512


def test_sizes_not_multiple_of_patch_are_padded():
    model = tiny_model()
    x = torch.randn(2, 3, 230, 250)
    with torch.no_grad():
        out = model(x)
        padded = model(F.pad(x, (0, 256 - 250, 0, 240 - 230)))
    assert out.seg.shape == (2, 5, 15, 16)
    torch.testing.assert_close(out.seg, padded.seg)
    full = resize_to_image(out.seg, (230, 250), model.stride)
    assert full.shape == (2, 5, 230, 250)
    expected = F.interpolate(out.seg, size=(240, 256), mode="bilinear", align_corners=False)[..., :230, :250]
    torch.testing.assert_close(full, expected)


def test_logits_and_cams_are_the_classifier_on_tokens():
    model = tiny_model()
    x = torch.randn(2, 3, 64, 96)
    with torch.no_grad():
        out = model(x)
        cam, aux_cam = model.cam(x), model.cam(x, aux=True)
    w = model.classifier.conv.weight[:, :, 0, 0]
    w_aux = model.aux_classifier.conv.weight[:, :, 0, 0]
    torch.testing.assert_close(out.logits, out.features.amax(dim=(2, 3)) @ w.T)
    torch.testing.assert_close(out.aux_logits, out.aux_features.amax(dim=(2, 3)) @ w_aux.T)
    torch.testing.assert_close(cam, torch.einsum("bdhw,cd->bchw", out.features, w))
    torch.testing.assert_close(aux_cam, torch.einsum("bdhw,cd->bchw", out.aux_features, w_aux))
    assert bool((cam < 0).any())  # raw CAMs: no ReLU inside the model


@pytest.mark.parametrize("aux_layer", [-3, 1])
def test_aux_tokens_are_block_output_without_final_norm(aux_layer):
    model = tiny_model(aux_layer=aux_layer)
    vit = model.backbone.vit
    x = torch.randn(1, 3, 48, 64)
    with torch.no_grad():
        out = model(x)
        t = vit.norm_pre(vit._pos_embed(vit.patch_embed(x)))
        for i, block in enumerate(vit.blocks):
            t = block(t)
            if i == aux_layer % len(vit.blocks):
                aux = t
        final = vit.norm(t)
    to_map = model.backbone.token_map
    torch.testing.assert_close(out.aux_features, to_map(aux, (48, 64)), atol=1e-5, rtol=0)
    torch.testing.assert_close(out.features, to_map(final, (48, 64)), atol=1e-5, rtol=0)


def test_param_groups_cover_every_parameter_once():
    model = tiny_model(name="gfsa")
    groups = model.param_groups(lr=6e-5, head_lr_mult=10.0, weight_decay=0.01)
    assert [g["name"] for g in groups] == ["backbone", "backbone_no_decay", "heads"]
    ids = [id(p) for g in groups for p in g["params"]]
    assert len(ids) == len(set(ids)) == len(list(model.parameters()))
    by_group = {g["name"]: {id(p) for p in g["params"]} for g in groups}
    vit = model.backbone.vit
    for p in (
        vit.pos_embed,
        vit.cls_token,
        vit.norm.weight,
        vit.blocks[0].attn.qkv.bias,
        vit.blocks[0].attn.w0,
    ):
        assert id(p) in by_group["backbone_no_decay"]
    assert id(vit.blocks[0].attn.qkv.weight) in by_group["backbone"]
    assert id(model.decoder.conv1.weight) in by_group["heads"] and id(model.classifier.conv.weight) in by_group["heads"]
    assert groups[2]["lr"] == pytest.approx(6e-4) and groups[1]["weight_decay"] == 0.0
    assert groups[0]["weight_decay"] == 0.01

    optimizer = torch.optim.AdamW(groups)
    model.train()
    out = model(torch.randn(2, 3, 32, 32))
    (out.logits.sum() + out.aux_logits.sum() + out.seg.mean()).backward()
    before = vit.blocks[0].attn.w1.detach().clone()
    optimizer.step()
    assert not torch.equal(before, vit.blocks[0].attn.w1)


def test_config_errors():
    with pytest.raises(ValueError, match="vanilla, centered, neutreno, gfsa, contranorm"):
        tiny_model(name="centred")
    with pytest.raises(ValueError, match="background"):
        tiny_model(num_classes=1)
    with pytest.raises(IndexError):
        tiny_model(aux_layer=4)
