"""The permutohedral lattice's three ways of numbering its points (a table over every cell, sorted int64 codes, sorted
key rows) build the same lattice, in the order pydensecrf's hash table inserts the points; the CPU's row softmax for
a few classes equals torch's. Parity of the whole CRF with pydensecrf: tests/inference/test_crf_parity.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from wsss.inference import crf as crf_module
from wsss.inference.crf import permutohedral


def features(kind: str, height: int = 37, width: int = 53, seed: int = 0) -> torch.Tensor:
    """(N, d) features as the CRF makes them: pixel positions alone (the Gaussian kernel, 2-d) or with colours (the
    bilateral kernel, 5-d), on colour noise with a smooth patch."""
    rng = np.random.default_rng(seed)
    image = rng.integers(0, 256, (height, width, 3)).astype(np.float32)
    image[: height // 2, : width // 2] = 120.0
    y, x = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
    xy = torch.stack([x.reshape(-1), y.reshape(-1)], dim=1).float()
    if kind == "gaussian":
        return xy / 1.0
    return torch.cat([xy / 20.0, torch.from_numpy(image).reshape(-1, 3) / 13.0], dim=1)


def two_images(kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Two images' features in one call (a batch: the image index is a key), sizes not multiples of 4 (padded)."""
    a, b = features(kind, 37, 53, seed=1), features(kind, 21, 30, seed=2)
    return torch.cat([a, b]), torch.arange(2).repeat_interleave(torch.tensor([len(a), len(b)]))


def dense(matrix: torch.Tensor) -> torch.Tensor:
    return matrix.to_dense()


@pytest.mark.parametrize("kind", ["gaussian", "bilateral"])
@pytest.mark.parametrize("batched", [False, True], ids=["one-image", "two-images"])
def test_the_three_numberings_build_the_same_lattice(monkeypatch, kind, batched):
    """Forced through each path in turn, the splat, slice and blur matrices are equal entry for entry: the same
    points, the same numbers, the same neighbours (a wrong margin or neighbour step would change the blur). The
    table is too large for colour keys (5-d); there the codes path is the reference."""
    feats, segments = two_images(kind) if batched else (features(kind), None)
    built = {}
    paths = (("table", 10**9, 62),) if kind == "gaussian" else ()
    for path, cells, bits in (*paths, ("codes", 0, 62), ("rows", 0, 0)):
        monkeypatch.setattr(permutohedral, "_DENSE_CELLS_PER_ENTRY", cells)
        monkeypatch.setattr(permutohedral, "_CODE_BITS", bits)
        built[path] = permutohedral.build_lattice(feats, segments, torch.float64, reference_padding=True)
    want = built.pop(next(iter(built)))
    for path, got in built.items():
        assert got.points == want.points, path
        for a, b in zip([got.splat, got.slice, *got.blur], [want.splat, want.slice, *want.blur], strict=True):
            torch.testing.assert_close(dense(a), dense(b), rtol=0, atol=0, msg=path)


@pytest.mark.parametrize("kind", ["gaussian", "bilateral"])
def test_lattice_points_are_numbered_in_the_order_pixels_reach_them(kind):
    """As pydensecrf's hash table inserts them: the first entry (pixel, vertex) reaching each point rises with the
    point's number, so neighbouring pixels splat into neighbouring rows. And a missing neighbour is row 0, which
    the splat never writes."""
    feats = features(kind)
    d = feats.shape[1]
    lattice = permutohedral.build_lattice(feats, dtype=torch.float64)
    columns = lattice.slice.col_indices().long()  # each pixel's d+1 points, + 1 (row 0 is the empty one)
    assert columns.numel() == feats.shape[0] * (d + 1)
    first = torch.full((lattice.points + 1,), columns.numel(), dtype=torch.long)
    first.scatter_reduce_(0, columns, torch.arange(columns.numel()) // (d + 1), "amin")
    first_pixel = first[1:]
    assert (first_pixel[1:] >= first_pixel[:-1]).all()  # pixel-major: ties are the vertices of one pixel
    assert first_pixel[0] == 0 and first_pixel.max() < feats.shape[0]
    assert lattice.splat.crow_indices()[1] == 0  # row 0 splats nothing


@pytest.mark.parametrize("classes", [1, 2, 3, 15, 16, 21])
def test_the_row_softmax_equals_torchs(classes):
    """Below 16 classes the mean-field takes its own softmax (faster there); with absent classes (-inf) too."""
    g = torch.Generator().manual_seed(classes)
    message = torch.randn(500, classes, generator=g) * 30
    if classes > 2:
        message[:, -1] = float("-inf")  # a class the image does not have
    want = torch.softmax(message, dim=1)
    got = crf_module._softmax(message.clone())
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    assert torch.isfinite(got).all()


@pytest.mark.parametrize("kind", ["gaussian", "bilateral"])
def test_every_vertex_and_neighbour_key_lies_in_the_code_box(kind):
    """Keys pack into one int64 code in mixed radix over the box of their columns' ranges: a key or a neighbour's key
    outside the box would borrow from the next column and could name another lattice point. Every vertex key
    (``_keys``) and every shift to a neighbour (+d on one column and -1 on the others, or the opposite) stays in."""
    feats = features(kind, 9, 11)
    rem0, rank = permutohedral._enclosing_simplex(permutohedral._elevate(feats))
    d = feats.shape[1]
    low, spans = permutohedral._code_box(rem0)
    keys = permutohedral._keys(rem0, rank, None)
    high = low + torch.tensor(spans) - 1
    for j in range(d + 1):
        step = torch.full((d,), -1)
        if j < d:
            step[j] = d
        for shift in (step, -step):
            assert ((keys + shift) >= low).all() and ((keys + shift) <= high).all()
