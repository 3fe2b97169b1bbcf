"""The permutohedral lattice's three ways of numbering its points (a table over every cell, sorted integer codes,
sorted key rows) find the same points and neighbours; pixel positions' points in the order pydensecrf's hash table
inserts them; the keys' codes; a shared workspace; the CPU's row softmax for a few classes equals torch's. Parity of
the whole CRF with pydensecrf: tests/inference/test_crf_parity.py."""

from __future__ import annotations

import math

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


def numbered(monkeypatch, path: str, feats: torch.Tensor, segments: torch.Tensor | None):
    """:func:`permutohedral._index_vertices` forced through one path: ``table``, ``codes`` or ``rows``; the
    neighbours as each direction's (first, second)."""
    cells, bits = {"table": (10**9, 62), "codes": (0, 62), "rows": (0, 0)}[path]
    monkeypatch.setattr(permutohedral, "_DENSE_CELLS_PER_ENTRY", cells)
    monkeypatch.setattr(permutohedral, "_CODE_BITS", bits)
    rem0, rank = permutohedral._enclosing_simplex(permutohedral._elevate(feats))
    images = 1 if segments is None else int(segments.max()) + 1
    vertex, neighbours, m, order, _ = permutohedral._index_vertices(rem0, rank, segments, images)
    first, second = neighbours.unbind(1)
    return vertex, list(zip(first, second, strict=True)), m, order


def neighbours_by_key(feats: torch.Tensor, segments: torch.Tensor | None, vertex: torch.Tensor, m: int) -> list:
    """Each direction's (first, second) neighbours + 1 of the M points numbered ``vertex``, found one by one in a
    dict of their keys (``_keys``): the first is the key -1 on every lattice column and +d on column j (none for
    j = d), the second the opposite; 0 where no point has that key."""
    rem0, rank = permutohedral._enclosing_simplex(permutohedral._elevate(feats))
    keys = permutohedral._keys(rem0, rank, segments)
    offset, d = keys.shape[1] - feats.shape[1], feats.shape[1]
    key_of = torch.empty(m, keys.shape[1], dtype=torch.long)
    key_of[vertex] = keys
    number = {tuple(k): i for i, k in enumerate(key_of.tolist())}
    out = []
    for j in range(d + 1):
        step = torch.full((keys.shape[1],), -1)
        step[:offset] = 0
        if j < d:
            step[offset + j] = d
        out.append(tuple(torch.tensor([number.get(tuple(k), -1) + 1 for k in (key_of + s).tolist()])
                         for s in (step, -step)))  # fmt: skip
    return out


@pytest.mark.parametrize("kind", ["gaussian", "bilateral"])
@pytest.mark.parametrize("batched", [False, True], ids=["one-image", "two-images"])
def test_the_three_numberings_find_the_same_points_and_neighbours(monkeypatch, kind, batched):
    """Forced through each path in turn, every point's two neighbours in every direction are the points of the
    shifted keys, found one by one in a dict (a wrong margin, neighbour step or second neighbour would break it);
    the points are the same up to their numbers: one renumbering maps every entry's point of one path to the
    other's, and every point's neighbours to the other's; the entries by point are the stable sort of their points; and
    the built lattices filter alike. The table is too large for colour keys (5-d): there the codes path is the
    reference."""
    feats, segments = two_images(kind) if batched else (features(kind), None)
    paths = ["table", "codes", "rows"] if kind == "gaussian" else ["codes", "rows"]
    want_vertex, want_neighbours, m, _ = numbered(monkeypatch, paths[0], feats, segments)
    for path in paths:
        vertex, neighbours, points, order = numbered(monkeypatch, path, feats, segments)
        assert points == m, path
        for got, want in zip(neighbours, neighbours_by_key(feats, segments, vertex, m), strict=True):
            assert torch.equal(got[0].long(), want[0]) and torch.equal(got[1].long(), want[1]), path
        renumber = torch.full((m + 1,), -1)
        renumber[want_vertex + 1] = vertex + 1
        renumber[0] = 0  # "absent" stays absent
        assert (renumber >= 0).all() and renumber.unique().numel() == m + 1, path  # one-to-one
        assert torch.equal(renumber[want_vertex + 1], vertex + 1), path
        for (want_n1, want_n2), (n1, n2) in zip(want_neighbours, neighbours, strict=True):
            mapped = torch.empty(m, dtype=torch.long)
            mapped[renumber[1:] - 1] = torch.arange(m)  # this path's point -> the reference's
            assert torch.equal(n1.long(), renumber[want_n1.long()][mapped]), path
            assert torch.equal(n2.long(), renumber[want_n2.long()][mapped]), path
        if order is not None:
            assert torch.equal(order, torch.sort(vertex, stable=True).indices), path
    values = torch.rand(feats.shape[0], 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    filtered = {}
    for path in paths:
        numbered(monkeypatch, path, feats[:1], None)  # sets the path
        sizes = None if segments is None else torch.bincount(segments).tolist()
        filtered[path] = permutohedral.build_lattice(feats, sizes, torch.float64, True).filter(values)
    for path in paths[1:]:
        torch.testing.assert_close(filtered[path], filtered[paths[0]], rtol=1e-12, atol=0, msg=path)


def test_pixel_lattice_points_are_numbered_in_the_order_pixels_reach_them():
    """Pixel positions' points (the Gaussian kernel) are numbered as pydensecrf's hash table inserts them: the first
    entry (pixel, vertex) reaching each point rises with the point's number, so neighbouring pixels splat into
    neighbouring rows. And a missing neighbour is row 0, which the splat never writes."""
    feats = features("gaussian")
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


def test_a_shared_workspace_carries_nothing_from_one_filter_to_the_next():
    """The mean-field reuses one workspace for both kernels and every iteration (:meth:`Lattice.filter` writes each
    product into it with ``beta=0``): filtering through a workspace full of NaN, larger than the lattice and used
    just before by another lattice and other values, gives what a fresh one gives, and ``add_to`` is added to."""
    g = torch.Generator().manual_seed(0)
    small = permutohedral.build_lattice(features("gaussian"), dtype=torch.float64)
    large = permutohedral.build_lattice(features("bilateral"), dtype=torch.float64)
    assert large.points > small.points
    workspace = permutohedral.workspace_for([small, large], 4, torch.float64, torch.device("cpu")).fill_(float("nan"))
    values = [torch.rand(features("gaussian").shape[0], 4, dtype=torch.float64, generator=g) for _ in range(2)]
    want = small.filter(values[1])
    large.filter(values[0], workspace=workspace)
    got = small.filter(values[1], workspace=workspace)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    base = torch.rand(values[1].shape, dtype=torch.float64, generator=g)
    torch.testing.assert_close(small.filter(values[1], add_to=base.clone(), workspace=workspace), base + want)


@pytest.mark.parametrize("classes", [1, 2, 3, 15, 16, 21])
def test_the_row_softmax_equals_torchs(classes):
    """Below 16 classes the mean-field takes its own softmax (faster there); with absent classes (-inf) too."""
    g = torch.Generator().manual_seed(classes)
    message = torch.randn(500, classes, generator=g) * 30
    if classes > 2:
        message[:, -1] = float("-inf")  # a class the image does not have
    want = torch.softmax(message, dim=1)
    got = torch.full_like(message, float("nan"))
    crf_module._softmax(message.clone(), got)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    assert torch.isfinite(got).all()


def simplices(d: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """40 random enclosing simplices in d dimensions, in a box of random extent per column: ``rem0`` (N, d+1)
    multiples of d+1 (the last column unused by the keys) and ``rank`` (N, d+1) a permutation of 0..d per row."""
    g = torch.Generator().manual_seed(seed)
    extent = torch.randint(1, 12, (d + 1,), generator=g)
    rem0 = (torch.rand(40, d + 1, generator=g) * extent).long() * (d + 1) - 7 * (d + 1)
    rank = torch.rand(40, d + 1, generator=g).argsort(dim=1)
    return rem0, rank


@pytest.mark.parametrize("d", [2, 5])
def test_every_vertex_and_neighbour_key_has_its_own_code_in_the_box(d):
    """Keys pack into one integer code ``sum_j (key_j - low_j) s_j`` (:func:`permutohedral._code_box`): every vertex
    key (``_keys``) and every shift to a neighbour (+d on one column and -1 on the others, or the opposite) gets a
    code in ``[0, span)`` (outside, a code could name another image's point or fall off the table), and no two
    distinct keys share one, though the codes count steps of d+1 per column (a last radix not a multiple of d+1
    lets two keys meet in some boxes: here in 8 of 25 boxes in 2-d, 11 in 5-d). And the codes span fewer cells
    than the keys' box: about (d+1)^(d-1) fewer, plus the margins."""
    for seed in range(25):
        rem0, rank = simplices(d, seed)
        low, strides, span = permutohedral._code_box(rem0)
        keys = permutohedral._keys(rem0, rank, None)
        every = [keys]
        for j in range(d + 1):
            step = torch.full((d,), -1)
            if j < d:
                step[j] = d
            every += [keys + step, keys - step]
        every = torch.cat(every).unique(dim=0)
        codes = ((every - torch.tensor(low)) * torch.tensor(strides)).sum(dim=1)
        assert codes.min() >= 0 and codes.max() < span, seed
        assert codes.unique().numel() == every.shape[0], seed
        box = math.prod(int(k) for k in every.max(0).values - every.min(0).values + 1)
        assert span < box / (d + 1) ** (d - 2), seed


def test_image_sizes_that_miss_points_are_refused():
    feats, _ = two_images("gaussian")
    with pytest.raises(ValueError, match=r"sizes \[1961, 629\] do not add up to the 2591 points"):
        permutohedral.build_lattice(feats, [1961, 629])
