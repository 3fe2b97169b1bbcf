import torch
import torch.nn.functional as F

from wsss.config import ParConfig
from wsss.par import PAR
from wsss.pseudo_label import boxes_to_mask, pseudo_labels, refine_cams_with_par


def reference_pseudo_labels(images, cams, labels, valid, par, fg_thresh, bg_thresh, scale, ignore_index):
    """ToCo's procedure written per image, with only the present classes, one PAR run per stack."""
    b, c, h, w = cams.shape
    size = (int(h * scale), int(w * scale))
    out = torch.full((b, h, w), ignore_index, dtype=torch.long)
    for i in range(b):
        keys = torch.tensor([0] + [k + 1 for k in range(c) if labels[i, k] > 0])
        image = F.interpolate(images[i : i + 1], size=size, mode="bilinear", align_corners=False)
        maps = []
        for t in (fg_thresh, bg_thresh):
            stack = torch.cat([torch.full((1, 1, h, w), t), cams[i : i + 1, keys[1:] - 1]], dim=1)
            stack = F.interpolate(stack, size=size, mode="bilinear", align_corners=False).softmax(dim=1)
            refined = F.interpolate(par(image, stack), size=(h, w), mode="bilinear", align_corners=False)
            maps.append(keys[refined.argmax(dim=1)[0]])
        high, low = maps
        label = high.clone()
        label[high == 0] = ignore_index
        label[(high == 0) & (low == 0)] = 0
        label[~valid[i]] = ignore_index
        out[i] = label
    return out


def test_boxes_to_mask():
    mask = boxes_to_mask(torch.tensor([[1, 3, 0, 2], [0, 4, 2, 5]]), 4, 5)
    assert mask[0].int().tolist() == [[0, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 0, 0, 0]]
    assert mask[1].int().tolist() == [[0, 0, 1, 1, 1]] * 4


def test_square_ring_background_and_box():
    # Colour regions: blue background, green ring (rows/cols 16..48), red square (24..40).
    h = w = 64
    images = torch.zeros(1, 3, h, w)
    images[:, 2] = 1.0
    ring = torch.zeros(h, w, dtype=torch.bool)
    ring[16:48, 16:48] = True
    square = torch.zeros(h, w, dtype=torch.bool)
    square[24:40, 24:40] = True
    ring &= ~square
    images[0, :, ring] = torch.tensor([0.0, 1.0, 0.0])[:, None]
    images[0, :, square] = torch.tensor([1.0, 0.0, 0.0])[:, None]
    cams = torch.zeros(1, 3, h, w)
    cams[0, 0] = 1.0  # absent class with a strong CAM everywhere
    cams[0, 1, square] = 0.9
    cams[0, 1, ring] = 0.4
    labels = torch.tensor([[0.0, 1.0, 1.0]])  # class 2 present with a zero CAM
    valid = boxes_to_mask(torch.tensor([[0, 64, 0, 56]]), h, w)

    out = pseudo_labels(images, cams, labels, valid, PAR.from_config(ParConfig()), 0.7, 0.25, 0.5, 255)
    assert out.shape == (1, h, w) and out.dtype == torch.long
    assert set(out.unique().tolist()) == {0, 2, 255}
    lab = out[0]
    assert (lab[26:38, 26:38] == 2).all()  # fg: 0.9 > 0.7
    assert (lab[18:22, 18:46] == 255).all()  # ring: between the thresholds -> ignore
    assert (lab[:14, :56] == 0).all() and (lab[50:, :56] == 0).all()  # bg: both stacks say bg
    assert (lab[:, 56:] == 255).all()  # outside the valid box


def test_batched_matches_per_image_reference():
    torch.manual_seed(0)
    b, c, h, w = 3, 5, 24, 20
    images = torch.rand(b, 3, h, w)
    # Smooth CAMs with a wide range so that all three outcomes occur.
    cams = F.interpolate(torch.rand(b, c, 6, 5), size=(h, w), mode="bilinear", align_corners=False)
    cams = (cams - cams.amin((2, 3), keepdim=True)) / (
        cams.amax((2, 3), keepdim=True) - cams.amin((2, 3), keepdim=True)
    )
    labels = torch.tensor([[1, 0, 1, 1, 0], [0, 0, 0, 0, 1], [0, 0, 0, 0, 0]], dtype=torch.float32)
    cams = cams * labels[:, :, None, None]
    valid = boxes_to_mask(torch.tensor([[0, 24, 0, 20], [2, 20, 3, 17], [0, 12, 0, 20]]), h, w)
    par = PAR.from_config(ParConfig(dilations=(1, 2, 4), num_iter=3))
    out = pseudo_labels(images, cams, labels, valid, par, 0.7, 0.25, 0.5, 255)
    ref = reference_pseudo_labels(images, cams, labels, valid, par, 0.7, 0.25, 0.5, 255)
    assert torch.equal(out, ref)
    assert {0, 255}.issubset(out.unique().tolist())
    # Only present classes appear; an image without classes is all background inside its box.
    assert set(out[0].unique().tolist()) <= {0, 1, 3, 4, 255}
    assert set(out[1].unique().tolist()) <= {0, 5, 255}
    assert (out[2, :12] == 0).all() and (out[2, 12:] == 255).all()


def test_refine_cams_with_par_single_threshold_and_shape():
    torch.manual_seed(1)
    images = torch.rand(2, 3, 16, 16)
    cams = torch.rand(2, 2, 16, 16)
    labels = torch.tensor([[1.0, 1.0], [0.0, 1.0]])
    par = PAR.from_config(ParConfig(dilations=(1, 2), num_iter=2))
    maps = refine_cams_with_par(images, cams, labels, (0.5,), par, 0.5)
    assert maps.shape == (1, 2, 16, 16)
    assert set(maps[0, 1].unique().tolist()) <= {0, 2}
    # A background plane above every CAM value gives all background; below every value, none.
    assert (refine_cams_with_par(images, cams, labels, (1.5,), PAR.from_config(ParConfig(num_iter=1)), 0.5) == 0).all()
    assert (refine_cams_with_par(images, cams, labels, (-1.0,), PAR.from_config(ParConfig(num_iter=1)), 0.5) > 0).all()
