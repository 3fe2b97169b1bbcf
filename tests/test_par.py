import math

import pytest
import torch

from wsss.config import ParConfig
from wsss.par import PAR, neighbour_offsets


def _std(values):
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def _softmax(scores):
    top = max(scores)
    exps = [math.exp(s - top) for s in scores]
    total = sum(exps)
    return [e / total for e in exps]


def reference_par(image, mask, dilations, num_iter, w1, w2):
    """PAR written plainly: Python loops over pixels, neighbours and channels, float64."""
    channels, height, width = len(image), len(image[0]), len(image[0][0])
    offsets = []
    for d in dilations:
        for dy in (-d, 0, d):
            for dx in (-d, 0, d):
                if (dy, dx) != (0, 0):
                    offsets.append((dy, dx))
    dist = [math.sqrt(dy * dy + dx * dx) for dy, dx in offsets]
    std_r = _std(dist)
    pos = _softmax([-((r / (std_r + 1e-8) / w1) ** 2) for r in dist])

    def clamp(v, n):
        return min(max(v, 0), n - 1)

    aff = [[None] * width for _ in range(height)]
    for y in range(height):
        for x in range(width):
            scores = [0.0] * len(offsets)
            for c in range(channels):
                nb = [image[c][clamp(y + dy, height)][clamp(x + dx, width)] for dy, dx in offsets]
                std_c = _std(nb)
                for k, v in enumerate(nb):
                    scores[k] += -((abs(v - image[c][y][x]) / (std_c + 1e-8) / w1) ** 2) / channels
            colour = _softmax(scores)
            aff[y][x] = [colour[k] + w2 * pos[k] for k in range(len(offsets))]
    for _ in range(num_iter):
        new = [[[0.0] * width for _ in range(height)] for _ in mask]
        for m in range(len(mask)):
            for y in range(height):
                for x in range(width):
                    new[m][y][x] = sum(
                        aff[y][x][k] * mask[m][clamp(y + dy, height)][clamp(x + dx, width)]
                        for k, (dy, dx) in enumerate(offsets)
                    )
        mask = new
    return mask


@pytest.mark.parametrize("dilations", [(1, 2, 3), (1, 12)])
def test_par_matches_pixel_loop_reference(dilations):
    torch.manual_seed(0)
    images = torch.rand(2, 3, 12, 10)
    images[:, :, :, :5] *= 0.3  # an edge, so the colour term is not uniform noise
    masks = torch.rand(2, 4, 12, 10)
    par = PAR(dilations=dilations, num_iter=2, w1=0.3, w2=0.01, kernel="torch")
    out = par(images, masks)
    for b in range(2):
        ref = reference_par(images[b].double().tolist(), masks[b].double().tolist(), dilations, 2, 0.3, 0.01)
        torch.testing.assert_close(out[b].double(), torch.tensor(ref, dtype=torch.float64), rtol=1e-5, atol=1e-6)


def test_par_offsets_and_affinity_sums():
    offsets = neighbour_offsets((1, 2, 4, 8, 12, 24))
    assert len(offsets) == 48 and len(set(offsets)) == 48 and (0, 0) not in offsets
    par = PAR.from_config(ParConfig())
    aff = par.affinity(torch.rand(1, 3, 16, 20))
    assert aff.shape == (1, 48, 16, 20)
    torch.testing.assert_close(aff.sum(1), torch.full((1, 16, 20), 1.01))
    pos = par.position_affinity() / par.w2
    # The position prior decreases with the neighbour distance.
    assert pos[0] < pos[1] and pos[1] > pos[8] > pos[16]


def test_par_uniform_image_keeps_constant_mask_up_to_row_sum():
    par = PAR.from_config(ParConfig(num_iter=3))
    masks = torch.full((1, 2, 9, 11), 0.5)
    out = par(torch.full((1, 3, 9, 11), 0.2), masks)
    torch.testing.assert_close(out, masks * 1.01**3)


def test_par_stops_at_colour_edges():
    # Left half black, right half white; a mask that is 1 on the left only stays mostly on the left.
    images = torch.zeros(1, 3, 16, 16)
    images[..., 8:] = 1.0
    masks = torch.zeros(1, 1, 16, 16)
    masks[..., :8] = 1.0
    out = PAR.from_config(ParConfig(dilations=(1, 2, 4)))(images, masks)
    assert out[..., :8].min() > 0.9
    assert out[..., 8:].max() < 0.1


def test_par_rejects_mismatched_sizes():
    with pytest.raises(ValueError, match="same batch and size"):
        PAR.from_config(ParConfig())(torch.rand(1, 3, 8, 8), torch.rand(1, 2, 4, 4))
