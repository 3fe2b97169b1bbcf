"""WSSSModel: output shapes for several input sizes, CAM = classifier per token, aux tokens, param groups."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from wsss.config import AttentionConfig, ModelConfig
from wsss.models import (
    ModelOutput,
    PixelResize,
    WSSSModel,
    bilinear_matrix,
    build_model,
    maps_to_pixels,
    resize_to_image,
)

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


def test_param_groups_reference_decays_everything_and_freezes_pos_embed():
    """The reference: 0.01 on every trained parameter, heads at 10x, ``pos_embed`` frozen (not optimised)."""
    model = tiny_model(name="gfsa")
    vit = model.backbone.vit
    assert not vit.pos_embed.requires_grad
    groups = model.param_groups(lr=6e-5, head_lr_mult=10.0, weight_decay=0.01, no_decay_1d=False)
    assert [g["name"] for g in groups] == ["backbone", "backbone_1d", "heads"]
    ids = [id(p) for g in groups for p in g["params"]]
    trained = [p for p in model.parameters() if p.requires_grad]
    assert len(ids) == len(set(ids)) == len(trained) == len(list(model.parameters())) - 1
    assert id(vit.pos_embed) not in ids
    assert [g["weight_decay"] for g in groups] == [0.01, 0.01, 0.01]
    assert [g["lr"] for g in groups] == pytest.approx([6e-5, 6e-5, 6e-4])
    by_group = {g["name"]: {id(p) for p in g["params"]} for g in groups}
    for p in (vit.cls_token, vit.norm.weight, vit.blocks[0].attn.qkv.bias, vit.blocks[0].attn.w0):
        assert id(p) in by_group["backbone_1d"]
    assert id(vit.blocks[0].attn.qkv.weight) in by_group["backbone"]
    assert id(model.decoder.conv1.weight) in by_group["heads"] and id(model.classifier.conv.weight) in by_group["heads"]

    optimizer = torch.optim.AdamW(groups)
    model.train()
    out = model(torch.randn(2, 3, 32, 32))
    (out.logits.sum() + out.aux_logits.sum() + out.seg.mean()).backward()
    before = vit.blocks[0].attn.w1.detach().clone()
    pos_before = vit.pos_embed.detach().clone()
    optimizer.step()
    assert not torch.equal(before, vit.blocks[0].attn.w1)
    assert torch.equal(pos_before, vit.pos_embed)


def test_param_groups_timm_habit_switches():
    """``no_decay_1d`` exempts the 1-D group; ``freeze_pos_embed=False`` trains the position embedding."""
    model = tiny_model(freeze_pos_embed=False)
    groups = model.param_groups(lr=6e-5, head_lr_mult=10.0, weight_decay=0.01, no_decay_1d=True)
    assert [g["weight_decay"] for g in groups] == [0.01, 0.0, 0.01]
    assert id(model.backbone.vit.pos_embed) in {id(p) for p in groups[1]["params"]}
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))


def test_heads_have_the_reference_init():
    """Bias-free LargeFOV and classifiers with PyTorch's default init: weights ~ U(-1/sqrt(fan_in), ...)."""
    model = tiny_model(num_classes=21)
    for conv in (model.decoder.conv1, model.decoder.conv2, model.decoder.cls, model.classifier.conv):
        assert conv.bias is None
        fan_in = conv.weight[0].numel()
        bound = 1 / fan_in**0.5  # kaiming_uniform_(a=sqrt(5)) gives U(-1/sqrt(fan_in), 1/sqrt(fan_in))
        weight = conv.weight.detach()
        assert weight.abs().max() <= bound
        assert float(weight.std()) == pytest.approx(bound / 3**0.5, rel=0.1)


def test_kaiming_head_init_switch():
    model = tiny_model(num_classes=21, head_init="kaiming")
    fan_in = model.classifier.conv.weight[0].numel()
    assert float(model.classifier.conv.weight.detach().std()) == pytest.approx((2 / fan_in) ** 0.5, rel=0.1)
    cls = model.decoder.cls.weight.detach()  # fan-out of a 1x1 conv: its output channels
    assert float(cls.std()) == pytest.approx((2 / cls.shape[0]) ** 0.5, rel=0.1)
    assert model.decoder.cls.bias is None


def test_config_errors():
    with pytest.raises(ValueError, match="vanilla, centered, neutreno, gfsa, contranorm"):
        tiny_model(name="centred")
    with pytest.raises(ValueError, match="background"):
        tiny_model(num_classes=1)
    with pytest.raises(ValueError, match=r"'model.aux_layer' \(4\) and 'model.backbone_kwargs.depth' \(4 for"):
        tiny_model(aux_layer=4)


@pytest.mark.parametrize("width", [40, 36])
def test_maps_to_pixels_keeps_patches_aligned(width):
    """Each patch's centre column, on the token grid, lands on that column of the image: for a width that is a
    multiple of the patch (one resize) and for one the model pads from 36 to 40 (padding cropped)."""
    p = 8
    grid_w = -(-width // p)
    centres = torch.arange(grid_w, dtype=torch.float32) * p + (p - 1) / 2
    maps = centres.view(1, 1, 1, grid_w).expand(1, 1, 2, grid_w)
    pixels = maps_to_pixels(maps, (16, width), p)
    assert pixels.shape == (1, 1, 16, width)
    inner = torch.arange(p // 2, width - p // 2, dtype=torch.float32)  # between the first and last centre
    torch.testing.assert_close(pixels[0, 0, 5, p // 2 : width - p // 2], inner)
    # what the training CAM did before: the padded grid stretched over the image, off by up to a patch
    stretched = F.interpolate(maps, size=(16, width), mode="bilinear", align_corners=False)
    assert width % p == 0 or not torch.allclose(stretched[0, 0, 5, p // 2 : width - p // 2], inner)


# (token grid, image size, stride, output size): the paper's 16x upsample; an image padded along its rows only, to its
# own size and to another, and one padded along its columns only (the unpadded axis then takes two resizes, as
# maps_to_pixels gives it); a downsample at stride 1 (CAMs already at the pixels); a one-token grid.
PIXEL_CASES = [
    ((28, 28), (448, 448), 16, None),
    ((3, 4), (40, 64), 16, None),
    ((3, 4), (40, 64), 16, (100, 75)),
    ((3, 5), (48, 70), 16, (20, 50)),
    ((7, 9), (7, 9), 1, (30, 40)),
    ((1, 1), (16, 16), 16, (5, 3)),
]


@pytest.mark.parametrize(("grid", "image", "stride", "size"), PIXEL_CASES)
def test_pixel_resize_is_maps_to_pixels_as_matrix_products(grid, image, stride, size):
    """``loss.seg_resize="matmul"``: the same values and gradients as ``F.interpolate``'s resizes (against both
    computed in float64, so neither rounding is the reference), in float32 rounding."""
    g = torch.Generator().manual_seed(0)
    maps = torch.randn(2, 3, *grid, generator=g, dtype=torch.float64)
    expected = maps_to_pixels(maps, image, stride, size)
    maps32 = maps.float().requires_grad_()
    got = PixelResize()(maps32, image, stride, size)
    assert got.shape == expected.shape
    torch.testing.assert_close(got.double(), expected, rtol=0, atol=2e-6)
    weights = torch.randn(expected.shape, generator=g, dtype=torch.float64)
    (got * weights.float()).sum().backward()
    maps64 = maps.clone().requires_grad_()
    (maps_to_pixels(maps64, image, stride, size) * weights).sum().backward()
    torch.testing.assert_close(maps32.grad.double(), maps64.grad, rtol=1e-6, atol=1e-4)


def test_bilinear_matrix_weighs_as_interpolate():
    """Each row holds ``1 - frac(s)`` and ``frac(s)`` at the sample's two neighbours (both on the last input past the
    end), rows summing to 1: F.interpolate of the identity, in float64."""
    for n_in, n_out in [(28, 448), (5, 3), (4, 9), (1, 6), (6, 6)]:
        eye = torch.eye(n_in, dtype=torch.float64)[None]  # (1, n_in, n_in): column k holds input k alone
        expected = F.interpolate(eye, size=n_out, mode="linear", align_corners=False)[0].T  # (n_out, n_in)
        torch.testing.assert_close(bilinear_matrix(n_in, n_out).double(), expected, rtol=0, atol=1e-6)
    assert torch.equal(bilinear_matrix(6, 6), torch.eye(6))


def test_pixel_resize_makes_its_weights_once_per_shape():
    """A training step resizes the same shapes every iteration: the weights are built at the first call only, then
    each call is the two products."""
    resize, maps = PixelResize(), torch.randn(1, 2, 3, 4)
    names = []

    class Names(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            names.append(func.__name__)
            return func(*args, **(kwargs or {}))

    with Names():
        first = resize(maps, (48, 64), 16)
    assert "arange.default" in names
    names.clear()
    with Names():
        again = resize(maps, (48, 64), 16)
    assert torch.equal(first, again)
    assert [n for n in names if n in ("mm.default", "bmm.default", "arange.default")] == ["mm.default", "bmm.default"]
    with Names():
        resize(maps, (48, 64), 16, (20, 20))  # another output size: weights of its own
    assert "arange.default" in names


def test_cam_covers_exactly_the_input():
    model = tiny_model()
    with torch.no_grad():
        aligned = torch.randn(1, 3, 64, 96)
        assert model.cam(aligned).shape == (1, 4, 4, 6)
        padded = torch.randn(1, 3, 60, 90)
        cam = model.cam(padded)
        token = model.classifier.cam(model(padded).features)
    assert cam.shape == (1, 4, 60, 90)
    torch.testing.assert_close(cam, resize_to_image(token, (60, 90), 16))


def test_under_an_onnx_export_the_classifier_pools_with_a_plain_maximum(monkeypatch):
    """The same logits without ``adaptive_max_pool2d``, which torch 2.11's ONNX exporter cannot translate."""
    from wsss.models import heads

    classifier = heads.Classifier(16, 5, kaiming_init=True)
    features = torch.randn(3, 16, 7, 9, generator=torch.Generator().manual_seed(0))
    want = classifier(features)

    def refused(*args, **kwargs):
        raise AssertionError("adaptive_max_pool2d under an ONNX export")

    monkeypatch.setattr(torch.onnx, "is_in_onnx_export", lambda: True)
    monkeypatch.setattr(heads.F, "adaptive_max_pool2d", refused)
    torch.testing.assert_close(classifier(features), want, rtol=0, atol=0)
