import torch
import torch.nn.functional as F

from wsss.cam import cam_to_label, multiscale_cam, scaled_size


class ToyCam:
    """A flip-equivariant stride-4 'CAM head': 1x1 projection of the pixels, 4x4 average pooling."""

    def __init__(self, num_classes: int = 3):
        g = torch.Generator().manual_seed(1)
        self.weight = torch.randn(num_classes, 3, 1, 1, generator=g)
        self.batch_sizes = []

    def __call__(self, x):
        self.batch_sizes.append(x.shape[0])
        return F.avg_pool2d(F.conv2d(x, self.weight), 4)


def reference_cam(cam_fn, images, labels, scales):
    """Plain per-image, per-scale, per-flip evaluation."""
    out = []
    for b in range(images.shape[0]):
        img = images[b : b + 1]
        h, w = img.shape[-2:]
        total = 0
        for s in scales:
            x = F.interpolate(img, size=(int(s * h), int(s * w)), mode="bilinear", align_corners=False)
            plain = F.interpolate(cam_fn(x), size=(h, w), mode="bilinear", align_corners=False)
            flipped = F.interpolate(cam_fn(x.flip(-1)), size=(h, w), mode="bilinear", align_corners=False).flip(-1)
            total = total + torch.relu(torch.maximum(plain, flipped))
        planes = []
        for c in range(total.shape[1]):
            p = total[0, c]
            planes.append((p - p.min()) / (p.max() - p.min() + 1e-5) * labels[b, c])
        out.append(torch.stack(planes))
    return torch.stack(out)


def test_multiscale_cam_matches_reference_and_batches_flips():
    torch.manual_seed(0)
    images = torch.randn(2, 3, 32, 24)
    labels = torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    cam_fn = ToyCam()
    cam = multiscale_cam(cam_fn, images, labels, scales=(1.0, 0.5, 1.5))
    assert cam.shape == (2, 3, 32, 24)
    assert cam_fn.batch_sizes == [4, 4, 4]  # image and flip run together at each scale
    torch.testing.assert_close(cam, reference_cam(ToyCam(), images, labels, (1.0, 0.5, 1.5)))
    # Present planes span [0, 1); absent planes are zero.
    assert cam[0, 1].abs().max() == 0 and cam[1, 0].abs().max() == 0 and cam[1, 2].abs().max() == 0
    for b, c in [(0, 0), (0, 2), (1, 1)]:
        assert cam[b, c].min() == 0
        assert 0.999 < cam[b, c].max() <= 1


def test_one_image_at_a_time_equals_the_whole_batch_to_the_bit():
    """The exports' and evaluations' path (each image's maps brought to full size alone) gives the batch path's
    numbers exactly, with and without flips, at scales up and down; the model still sees the whole batch."""
    torch.manual_seed(0)
    images = torch.randn(3, 3, 32, 24)
    labels = torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    for flip in (True, False):
        batch = multiscale_cam(ToyCam(), images, labels, (1.0, 0.5, 1.5), flip=flip)
        cam_fn = ToyCam()
        alone = multiscale_cam(cam_fn, images, labels, (1.0, 0.5, 1.5), flip=flip, one_image_at_a_time=True)
        assert torch.equal(alone, batch) and alone[2].amin() == 0 and alone[2].amax() > 0.999
        assert cam_fn.batch_sizes == [6 if flip else 3] * 3


def test_multiscale_cam_is_flip_equivariant():
    torch.manual_seed(0)
    images = torch.randn(1, 3, 32, 32)
    labels = torch.ones(1, 3)
    cam = multiscale_cam(ToyCam(), images, labels, (1.0, 0.5, 1.5))
    cam_of_flip = multiscale_cam(ToyCam(), images.flip(-1), labels, (1.0, 0.5, 1.5))
    torch.testing.assert_close(cam_of_flip, cam.flip(-1))


def test_multiscale_cam_hand_computed_single_scale():
    # Identity CAM head on a 1x2 image: class 0 = [-1, 3] -> ReLU [0, 3] -> [0, 3 / (3 + 1e-5)].
    images = torch.tensor([[[[-1.0, 3.0]], [[2.0, 2.0]], [[0.0, 0.0]]]])
    cam = multiscale_cam(lambda x: x[:, :2], images, torch.tensor([[1.0, 1.0]]), scales=(1.0,), flip=False)
    torch.testing.assert_close(cam[0, 0, 0], torch.tensor([0.0, 3.0 / (3.0 + 1e-5)]))
    # A constant plane normalises to 0 (the 1e-5 guard), not NaN.
    torch.testing.assert_close(cam[0, 1, 0], torch.tensor([0.0, 0.0]))


def test_multiscale_cam_flip_takes_max_of_both_directions():
    # A head that is not flip-equivariant (it weights columns 1, 0.5, 0.25, 0) on x = [0, 1, 4, 2]:
    # plain [0, 0.5, 1, 0]; on the flip [2, 4, 1, 0] -> [2, 2, 0.25, 0], un-flipped [0, 0.25, 2, 2];
    # max [0, 0.5, 2, 2], normalised by 2 + 1e-5.
    images = torch.tensor([0.0, 1.0, 4.0, 2.0]).view(1, 1, 1, 4).expand(1, 3, 1, 4)
    ramp = torch.tensor([1.0, 0.5, 0.25, 0.0])
    cam = multiscale_cam(lambda x: x[:, :1] * ramp, images, torch.ones(1, 1), scales=(1.0,), flip=True)
    torch.testing.assert_close(cam[0, 0, 0], torch.tensor([0.0, 0.5, 2.0, 2.0]) / (2.0 + 1e-5))


def test_cam_to_label():
    cam = torch.tensor(
        [
            [[0.9, 0.2, 0.5, 0.0]],  # class 0
            [[0.8, 0.3, 0.6, 0.0]],  # class 1 (absent)
            [[0.1, 0.4, 0.5, 0.0]],  # class 2
        ]
    ).view(1, 3, 1, 4)
    labels = torch.tensor([[1.0, 0.0, 1.0]])
    out = cam_to_label(cam, labels, bg_thresh=0.5)
    # pixel 0: class 0 (0.9); pixel 1: 0.4 <= 0.5 -> bg; pixel 2: tie at the threshold -> bg; pixel 3: bg.
    assert out.tolist() == [[[1, 0, 0, 0]]]
    assert cam_to_label(cam, labels, bg_thresh=0.45).tolist() == [[[1, 0, 1, 0]]]
    assert cam_to_label(cam, torch.zeros(1, 3), bg_thresh=0.0).tolist() == [[[0, 0, 0, 0]]]


def test_a_one_pixel_image_keeps_one_pixel_at_every_scale():
    """A 1x1 (or 1xN) image at scale 0.5 once asked interpolate for 0 pixels (``Input and output sizes should be
    greater than 0``, from tools/make_pseudo_labels.py); it stays one pixel high, as inference sizes it."""
    assert scaled_size(0.5, (1, 10000)) == (1, 5000) and scaled_size(1.5, (3, 4)) == (4, 6)
    for size in ((1, 1), (1, 9)):
        images = torch.rand(1, 3, *size)
        cam = multiscale_cam(lambda x: x[:, :2] + x.shape[-1], images, torch.ones(1, 2), scales=(1.0, 0.5))
        assert cam.shape == (1, 2, *size) and torch.isfinite(cam).all()
