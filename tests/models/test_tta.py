"""Test-time augmentation against hand-written loops; batching changes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import tiny_config
from wsss.cam import multiscale_cam, normalize_cams, scaled_size
from wsss.models import ModelOutput, build_model, maps_to_pixels, resize_to_image
from wsss.models.tta import predict_logits, tta_forward

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_model(seed: int = 0):
    torch.manual_seed(seed)
    return build_model(tiny_config(Path("unused")).model, num_classes=3).eval()


def hand_tta(model, image, scales, flip):
    """The reference: every scale and flip run on its own, no batching."""
    h, w = image.shape[-2:]
    best = None
    for s in scales:
        size = (int(s * h), int(s * w))
        x = F.interpolate(image, size=size, mode="bilinear", align_corners=False) if size != (h, w) else image
        views = [x, x.flip(-1)] if flip else [x]
        total = 0
        for k, view in enumerate(views):
            seg = resize_to_image(model(view).seg, size, model.stride)
            if size != (h, w):
                seg = F.interpolate(seg, size=(h, w), mode="bilinear", align_corners=False)
            total = total + (seg.flip(-1) if k == 1 else seg)
        best = total if best is None else torch.maximum(best, total)
    return best


@torch.no_grad()
def test_predict_logits_matches_hand_loop():
    model = tiny_model()
    image = torch.randn(1, 3, 37, 45)  # not multiples of the 8 px patch
    for scales, flip in [((1.0, 0.75, 1.5), True), ((1.25,), False), ((0.5, 1.0), True)]:
        got = predict_logits(model, image, scales, flip)
        assert got.shape == (1, 3, 37, 45)
        torch.testing.assert_close(got, hand_tta(model, image, scales, flip), atol=1e-5, rtol=1e-5)
    # max over scales is not a no-op here
    one_scale = predict_logits(model, image, (1.0,), True)
    assert not torch.allclose(one_scale, predict_logits(model, image, (1.0, 1.5), True))


class RampModel(torch.nn.Module):
    """seg = 4x4 average pooling of the image + a column ramp: not flip-symmetric, stride 4."""

    stride = 4

    def forward(self, x):
        pooled = F.avg_pool2d(x, 4, ceil_mode=True)
        ramp = torch.arange(pooled.shape[-1], dtype=x.dtype).expand_as(pooled)
        zeros = x.new_zeros(x.shape[0], 2)
        return ModelOutput(logits=zeros, aux_logits=zeros, seg=pooled + ramp, features=x, aux_features=x)


def test_flip_is_undone():
    image = torch.rand(2, 3, 24, 32)
    pooled = F.avg_pool2d(image, 4)
    w = pooled.shape[-1]
    got = predict_logits(RampModel(), image, scales=(1.0,), flip=True)
    # model(x) + unflip(model(flip(x))) = 2 * pool(x) + ramp + reversed ramp = 2 * pool(x) + (w - 1)
    torch.testing.assert_close(got, resize_to_image(2 * pooled + (w - 1), (24, 32), 4), atol=1e-5, rtol=0)
    forgot_unflip = resize_to_image(pooled + F.avg_pool2d(image.flip(-1), 4) + 2 * torch.arange(w), (24, 32), 4)
    assert (got - forgot_unflip).abs().max() > 1.0
    no_flip = predict_logits(RampModel(), image, scales=(1.0,), flip=False)
    torch.testing.assert_close(no_flip, resize_to_image(pooled + torch.arange(w), (24, 32), 4))


@torch.no_grad()
def test_tta_cams_equal_multiscale_cam_and_batching_is_exact():
    model = tiny_model(1)
    images = torch.randn(3, 3, 29, 40)
    labels = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    out = tta_forward(model, images, (1.0, 0.5, 1.5), True, cams=True)
    reference = multiscale_cam(model.cam, images, labels, (1.0, 0.5, 1.5))
    torch.testing.assert_close(out.cam * labels[:, :, None, None], reference, atol=1e-5, rtol=1e-5)
    for i in range(3):  # a batch of three gives each image's own result
        single = tta_forward(model, images[i : i + 1], (1.0, 0.5, 1.5), True, cams=True)
        torch.testing.assert_close(single.seg, out.seg[i : i + 1], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(single.cls_logits, out.cls_logits[i : i + 1], atol=1e-5, rtol=1e-5)


@torch.no_grad()
def whole_batch_tta(model, images, scales, flip):
    """The reference: every scale's maps of the whole batch brought to full size at once (seg, cls, cam)."""
    b, _, h, w = images.shape
    seg_max = cam_sum = None
    cls_sum, passes = 0.0, 0
    for s in scales:
        size = scaled_size(s, (h, w))
        x = images if size == (h, w) else F.interpolate(images, size=size, mode="bilinear", align_corners=False)
        x = torch.cat([x, x.flip(-1)]) if flip else x
        out = model(x)
        seg = maps_to_pixels(out.seg.float(), size, model.stride, (h, w))
        seg = seg[:b] + seg[b:].flip(-1) if flip else seg
        seg_max = seg if seg_max is None else torch.maximum(seg_max, seg)
        cls_sum = cls_sum + (out.logits[:b] + out.logits[b:] if flip else out.logits)
        passes += 2 if flip else 1
        cam = maps_to_pixels(model.classifier.cam(out.features).float(), size, model.stride, (h, w))
        cam = F.relu(torch.maximum(cam[:b], cam[b:].flip(-1)) if flip else cam)
        cam_sum = cam if cam_sum is None else cam_sum + cam
    return seg_max, cls_sum / passes, normalize_cams(cam_sum)


@pytest.mark.parametrize("flip", [True, False])
def test_one_image_at_a_time_equals_the_whole_batch_exactly(flip):
    """tta_forward brings the maps to full size an image at a time (the memory of one image's, not the batch's):
    the same numbers, to the bit, as the whole batch's maps at once."""
    model = tiny_model(2)
    images = torch.randn(3, 3, 29, 43)  # not multiples of the patch: the maps are cropped at every scale
    out = tta_forward(model, images, (1.0, 0.75, 1.5), flip, cams=True)
    seg, cls_logits, cam = whole_batch_tta(model, images, (1.0, 0.75, 1.5), flip)
    assert torch.equal(out.seg, seg) and torch.equal(out.cls_logits, cls_logits) and torch.equal(out.cam, cam)
