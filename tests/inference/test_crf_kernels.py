"""The torch CRF's Triton kernels (:mod:`wsss.inference.crf.kernels`, ``infer.crf.kernel``) against PyTorch's sparse
products and pydensecrf.

Without a GPU the kernels run in Triton's CPU interpreter (``TRITON_INTERPRET=1``, set in ``conftest.py``), so the
images are small; on a GPU the same tests run the compiled kernels on CUDA tensors.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from tests.inference.test_crf_parity import assert_same_crf, smooth_probs
from tests.triton_interpreter import needs_kernel
from wsss.config import CrfConfig
from wsss.inference import crf as crf_module
from wsss.inference.crf import (
    CrfPool,
    crf_labels,
    crf_labels_stacked,
    dense_crf,
    dense_crf_batch,
    kernels,
    permutohedral,
    uses_kernels,
)
from wsss.utils.allocations import SkippedLaunches, peak_allocated
from wsss.utils.op_count import OpCounter

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")

pytestmark = [pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta state"), needs_kernel]


def csr(rows: int, cols: int, lengths: list[int], seed: int) -> torch.Tensor:
    """A float32 CSR matrix whose row ``r`` has ``lengths[r % len(lengths)]`` entries in random columns."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.tensor([lengths[r % len(lengths)] for r in range(rows)])
    crow = torch.zeros(rows + 1, dtype=torch.int32)
    crow[1:] = counts.cumsum(0)
    nnz = int(crow[-1])
    col = torch.randint(0, cols, (nnz,), generator=g, dtype=torch.int32)
    values = torch.rand(nnz, generator=g) - 0.25
    return torch.sparse_csr_tensor(crow, col, values, (rows, cols), check_invariants=False).to(DEVICE)


@pytest.mark.parametrize(
    ("rows", "lengths", "channels", "with_base", "softmax"),
    [
        (300, [0, 3, 1, 17, 2], 5, False, 0),  # empty rows, one row much longer than its block's others
        (70, [3], 33, True, 0),  # two channel blocks
        (9, [6], 81, True, 1),  # COCO's classes, the softmax over a 128-wide row
        (40, [1, 2], 1, True, 1),  # one channel: the softmax is 1
        (513, [2], 21, False, 1),  # a last block of one row
        (37, [3, 1], 12, True, 3),  # three stacks of 4 classes (the export's), each row's softmax per stack
        (20, [2], 9, False, 3),  # three stacks of 3 classes in a 16-wide block
    ],
)
def test_a_product_is_the_dense_product(rows, lengths, channels, with_base, softmax):
    """Against the dense float64 product, the base added and the softmax taken per row (of each of ``softmax`` groups
    of its channels), rows of 0 to 17 entries."""
    matrix = csr(rows, 50, lengths, seed=rows)
    g = torch.Generator().manual_seed(1)
    values = torch.randn(60, channels, generator=g).to(DEVICE)  # more rows than the matrix has columns
    base = torch.randn(rows, channels, generator=g).to(DEVICE) if with_base else None
    out = torch.full((rows, channels), float("nan"), device=DEVICE)
    got = kernels.product(matrix, values, out, base=base, softmax=softmax > 0, groups=max(softmax, 1))
    want = matrix.to_dense().double() @ values[:50].double() + (0 if base is None else base.double())
    if softmax:
        want = want.view(rows, softmax, -1).softmax(2).view(rows, channels)
    assert got is out
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_a_product_may_add_into_its_base():
    """``out`` is ``base``: the message summed in place (the second kernel's slice)."""
    matrix = csr(100, 40, [4], seed=2)
    values = torch.randn(40, 21).to(DEVICE)
    message = torch.randn(100, 21).to(DEVICE)
    want = message + matrix.to_dense() @ values
    torch.testing.assert_close(kernels.product(matrix, values, message, base=message), want, rtol=1e-5, atol=1e-5)


def test_the_kernel_refuses_what_it_cannot_read():
    matrix = csr(10, 8, [2], seed=3)
    values, out = torch.randn(8, 3, device=DEVICE), torch.empty(10, 3, device=DEVICE)
    with pytest.raises(ValueError, match=r"on one device, got .*meta"):
        kernels.product(matrix, values, out.to("meta"))
    with pytest.raises(ValueError, match=r"on one device, got .*meta"):
        kernels.simplices(torch.rand(4, 2, device=DEVICE), torch.ones(2, device="meta"), 1 / 3)
    with pytest.raises(ValueError, match="at most 128 channels, got 129"):
        kernels.product(matrix, torch.randn(8, 129, device=DEVICE), torch.empty(10, 129, device=DEVICE), softmax=True)
    with pytest.raises(ValueError, match="cannot split 3 channels into 2 equal groups"):
        kernels.product(matrix, values, out, softmax=True, groups=2)
    with pytest.raises(ValueError, match=r"cannot take \(10, 8\) @ \(7, 3\) into \(10, 3\)"):
        kernels.product(matrix, values[:7], out)
    with pytest.raises(ValueError, match="float32 values and contiguous"):
        kernels.product(matrix, values.double(), out)
    with pytest.raises(ValueError, match="float32 values and contiguous"):
        kernels.product(matrix, torch.randn(3, 8, device=DEVICE).T, out)


def pixel_features(height: int, width: int, sxy: float, srgb: float | None = None, seed: int = 0) -> torch.Tensor:
    """The Gaussian kernel's (x, y) / sxy, or the bilateral one's with colour noise and a flat patch / srgb."""
    y, x = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
    xy = torch.stack([x.reshape(-1), y.reshape(-1)], dim=1).float() / sxy
    if srgb is None:
        return xy
    rgb = torch.randint(0, 256, (height * width, 3), generator=torch.Generator().manual_seed(seed)).float()
    rgb[: height * width // 3] = 128.0
    return torch.cat([xy, rgb / srgb], dim=1)


@pytest.mark.parametrize(
    "features",
    [pixel_features(31, 37, 1.0), pixel_features(17, 23, 3.0), pixel_features(29, 31, 121.0, 5.0),
     pixel_features(13, 11, 20.0, 13.0, seed=1), torch.randn(300, 4, generator=torch.Generator().manual_seed(2)) * 7,
     pixel_features(1, 1, 3.0), torch.randint(-4000, 4000, (4000, 2), generator=torch.Generator().manual_seed(3)) / 64,
     torch.tensor([[50.796875, -0.421875, 55.1875, 43.84375, 30.3125], [28.53125, 56.75, -12.703125, -37.578125,
                   -27.0625], [-7.59375, -42.921875, 1.203125, 8.625, -13.234375]])],
    ids=["gaussian-1", "gaussian-3", "bilateral", "bilateral-narrow", "random-4d", "one-point", "halves-2d",
         "halves-5d"],
)  # fmt: skip
def test_the_simplices_are_pytorchs_exactly(features):
    """Elevation, enclosing simplex (rounding half to even, the ranks' tie rule) and barycentric weights: every value
    equal to the PyTorch functions'. Integer pixel positions make ties of the ranks; features in 64ths put a
    coordinate / (d + 1) exactly halfway between two integers (about 1 % of 2-d points; the three 5-d rows found among
    2 million): on such a boundary rounding up or to the even integer gives the same simplex and weights (checked
    with PyTorch's functions, so no test can tell the two apart)."""
    d = features.shape[1]
    elevated = permutohedral._elevate(features)
    rem0, rank = permutohedral._enclosing_simplex(elevated)
    weights = permutohedral._barycentric(elevated, rem0, rank)
    scales = torch.tensor(permutohedral._elevation_scales(d), device=DEVICE)
    got = kernels.simplices(features.to(DEVICE), scales, permutohedral._down(d))
    for a, b in zip(got, (rem0, rank, weights), strict=True):
        assert a.dtype == b.dtype and torch.equal(a.cpu(), b)


def blur_matrix(neighbours: torch.Tensor) -> torch.Tensor:
    """The dense (M+1, M+1) blur ``I + (P_-1 + P_+1) / 2`` of one direction's (2, M) neighbours + 1 (0: absent, the
    zero row 0, which reads nothing)."""
    m = neighbours.shape[1]
    dense = torch.zeros(m + 1, m + 1, dtype=torch.float64)
    rows = torch.arange(1, m + 1)
    dense[rows, rows] = 1.0
    for side in neighbours.long().cpu():
        dense.index_put_((rows, side), torch.full((m,), 0.5, dtype=torch.float64), accumulate=True)
    return dense


@pytest.mark.parametrize("kind", ["gaussian", "bilateral"])
def test_the_fused_lattice_is_the_pytorch_one(kind):
    """Two images of one lattice with pydensecrf's padding points: every index and weight of the splat and the slice
    the same, and each direction's neighbours the blur matrix of the PyTorch lattice."""
    colour = None if kind == "gaussian" else 5.0
    features = torch.cat([pixel_features(9, 11, 3.0, colour), pixel_features(7, 6, 3.0, colour, seed=3)]).to(DEVICE)
    built = [permutohedral.build_lattice(features, [99, 42], reference_padding=True, fused=fused) for fused in (0, 1)]
    assert built[0].points == built[1].points and built[1].blur == [] and built[0].neighbours is None
    for a, b in zip(*[[m for m in (b.splat, b.slice)] for b in built], strict=True):
        for part in ("crow_indices", "col_indices", "values"):
            assert torch.equal(getattr(a, part)(), getattr(b, part)()), part
    d = features.shape[1]
    assert built[1].neighbours.shape == (d + 1, 2, built[1].points)
    for matrix, neighbours in zip(built[0].blur, built[1].neighbours, strict=True):
        assert torch.equal(matrix.to_dense().cpu().double(), blur_matrix(neighbours))


@pytest.mark.parametrize("kind", ["gaussian", "bilateral"])
def test_the_simplices_kernel_builds_the_pytorch_lattice(kind):
    """CUDA's ``auto`` (``build_lattice(simplices_kernel=True)``): the simplices found by their kernel, the products'
    matrices PyTorch's: every index and weight of the splat, the slice and each direction's blur the same as without
    the kernel, for two images with pydensecrf's padding points."""
    colour = None if kind == "gaussian" else 5.0
    features = torch.cat([pixel_features(9, 11, 3.0, colour), pixel_features(7, 6, 3.0, colour, seed=3)]).to(DEVICE)
    built = [permutohedral.build_lattice(features, [99, 42], reference_padding=True, simplices_kernel=k)
             for k in (False, True)]  # fmt: skip
    assert built[0].points == built[1].points and built[1].neighbours is None
    assert len(built[1].blur) == features.shape[1] + 1
    for a, b in zip(*[[b.splat, b.slice, *b.blur] for b in built], strict=True):
        for part in ("crow_indices", "col_indices", "values"):
            assert torch.equal(getattr(a, part)(), getattr(b, part)()), part


@pytest.mark.parametrize(
    ("kernel", "device", "expected"),
    [("auto", "cuda", True), ("auto", "cpu", False), ("fused", "cpu", True), ("torch", "cuda", False)],
)
def test_where_the_simplices_kernel_runs(kernel, device, expected, monkeypatch):
    """With ``auto`` on CUDA beside PyTorch's products, with ``fused`` everywhere, never with ``torch`` or on the CPU's
    ``auto`` (where Triton only interprets), and not without triton."""
    assert crf_module.finds_simplices_by_kernel(CrfConfig(kernel=kernel), device) is expected
    monkeypatch.setattr(permutohedral, "kernels", None)  # without triton: PyTorch's operations (fused says why)
    if kernel != "fused":
        assert not crf_module.finds_simplices_by_kernel(CrfConfig(kernel=kernel), device)


@pytest.mark.parametrize("channels", [1, 21, 40])
def test_the_blur_kernel_is_the_blur_matrixs_product(channels):
    """Each direction of a two-image lattice: the blur read from the neighbours equals the product kernel with the
    PyTorch path's blur matrix (the same sums in the same order: exactly, in the interpreter), and the dense float64
    product within float32 rounding; row 0 stays 0."""
    features = torch.cat([pixel_features(9, 11, 3.0, 5.0), pixel_features(7, 6, 3.0, 5.0, seed=3)]).to(DEVICE)
    built = [permutohedral.build_lattice(features, [99, 42], reference_padding=True, fused=fused) for fused in (0, 1)]
    g = torch.Generator().manual_seed(channels)
    values = torch.rand(built[0].points + 1, channels, generator=g).to(DEVICE)
    values[0] = 0.0
    for matrix, neighbours in zip(built[0].blur, built[1].neighbours, strict=True):
        got = kernels.blur(neighbours, values, torch.full_like(values, float("nan")))
        want = kernels.product(matrix, values, torch.empty_like(values))
        if kernels.is_interpreted():
            assert torch.equal(got, want)
        torch.testing.assert_close(got.double().cpu(), blur_matrix(neighbours) @ values.double().cpu(), rtol=1e-6,
                                   atol=1e-6)  # fmt: skip
        assert not got[0].any()


@pytest.mark.parametrize("channels", [1, 21, 40])
def test_blurs_of_several_directions_in_one_launch_are_the_launches_one_after_the_other(channels):
    """``infer.crf.blur_directions``: a launch that blurs 2 or 3 consecutive directions (each earlier direction's rows
    computed where the next reads them) gives the bits of as many one-direction launches (in the interpreter; the
    same sums compiled), from every direction of the Gaussian kernel's 2-d lattice, two images' bilateral 5-d one and
    a fixed box's (whose rows past its real points stay as they are); row 0 stays 0."""
    bilateral = torch.cat([pixel_features(9, 11, 3.0, 5.0), pixel_features(7, 6, 3.0, 5.0, seed=3)])
    box = permutohedral.fixed_box([0.0, 0.0], [10.0, 8.0], 1, DEVICE)
    lattices = [permutohedral.build_lattice(pixel_features(9, 11, 1.0).to(DEVICE), fused=True),
                permutohedral.build_lattice(bilateral.to(DEVICE), [99, 42], reference_padding=True, fused=True),
                permutohedral.build_lattice(pixel_features(9, 11, 1.0).to(DEVICE), fused=True, box=box)]  # fmt: skip
    assert lattices[2].live is not None and int(lattices[2].live) < lattices[2].points
    g = torch.Generator().manual_seed(channels)
    for lattice in lattices:
        values = torch.rand(lattice.points + 1, channels, generator=g).to(DEVICE)
        values[0] = 0.0
        live = None if lattice.live is None else int(lattice.live) + 1
        if live is not None:
            values[live:] = 7.0
        for k in (2, 3):
            for j in range(len(lattice.neighbours) - k + 1):
                want = values
                for i in range(j, j + k):
                    want = kernels.blur(lattice.neighbours[i], want, values.clone(), live=lattice.live)
                got = kernels.blur(lattice.neighbours[j : j + k], values, torch.full_like(values, float("nan")),
                                   live=lattice.live)  # fmt: skip
                if live is not None:  # the rows past the real points are left as the output held them
                    assert got[live:].isnan().all()
                    got, want = got[:live], want[:live]
                if kernels.is_interpreted():
                    assert torch.equal(got, want), (k, j)
                torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
                assert not got[0].any()


@pytest.mark.parametrize(("sizes", "classes"), [([(7, 9), (5, 6)], 3), ([(6, 5)], 21), ([(4, 5)], 130)])
def test_the_crf_is_the_same_whatever_the_directions_one_blur_launch_takes(sizes, classes):
    """Whole calls (both lattices, their normalisation, the mean-field; an even and an odd number of blur launches
    per lattice, whose last one must land in the buffer the slice reads) at 2 and 3 directions per blur launch give
    the marginals of 1, bit for bit in the interpreter."""
    images, probs = images_and_probs(sizes, classes)
    cfg = CrfConfig(iterations=2, kernel="fused")
    want = dense_crf_batch(images, probs, cfg)
    for directions in (2, 3):
        got = dense_crf_batch(images, probs, dataclasses.replace(cfg, blur_directions=directions))
        for a, b in zip(got, want, strict=True):
            if kernels.is_interpreted():
                assert torch.equal(a, b), directions
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_the_blur_kernel_refuses_what_it_cannot_read():
    neighbours = torch.zeros(2, 4, dtype=torch.int32, device=DEVICE)
    values = torch.zeros(5, 3, device=DEVICE)
    with pytest.raises(ValueError, match="cannot take"):
        kernels.blur(neighbours[:, :3], values, torch.empty_like(values))
    with pytest.raises(ValueError, match="cannot take"):  # more directions than one launch takes
        kernels.blur(neighbours.expand(4, 2, 4), values, torch.empty_like(values))
    with pytest.raises(ValueError, match="float32"):
        kernels.blur(neighbours, values.double(), torch.empty_like(values))
    lattice = permutohedral.build_lattice(pixel_features(3, 4, 1.0).to(DEVICE), fused=True)
    with pytest.raises(RuntimeError, match="filter_fused"):
        lattice.filter(torch.ones(12, 1, device=DEVICE))
    plain = permutohedral.build_lattice(pixel_features(3, 4, 1.0).to(DEVICE))
    with pytest.raises(RuntimeError, match=r"fused=True"):
        plain.filter_fused(torch.ones(12, 1, device=DEVICE), torch.empty(12, 1, device=DEVICE),
                           permutohedral.workspace_for([plain], 1, torch.float32, DEVICE))  # fmt: skip


@pytest.mark.parametrize(
    ("channels", "softmax", "groups"), [(1, False, 1), (21, True, 1), (12, True, 3), (40, False, 1)]
)
def test_the_two_slices_in_one_launch_are_the_two_launches_exactly(channels, softmax, groups):
    """``filter_pair_fused`` (the mean-field's two kernels' slices in one launch, the message never stored) gives the
    bits of the two ``filter_fused`` calls one after the other, with either lattice the larger (the workspace's
    layout spreads them in either order) and values in both (NaN where no lattice value is written)."""
    pairs = [(pixel_features(9, 11, 1.0), pixel_features(9, 11, 3.0, 5.0, seed=4)),  # more colour points
             (pixel_features(9, 11, 0.5), pixel_features(9, 11, 100.0, 1000.0, seed=5))]  # more position points
    orders = set()
    for gaussian, bilateral in pairs:
        lattices = tuple(permutohedral.build_lattice(f.to(DEVICE), reference_padding=True, fused=True)
                         for f in (gaussian, bilateral))  # fmt: skip
        g = torch.Generator().manual_seed(channels)
        values = torch.rand(99, channels, generator=g).to(DEVICE)
        base = torch.randn(99, channels, generator=g).to(DEVICE)
        workspace = permutohedral.workspace_for(list(lattices), channels, torch.float32, DEVICE)
        message = lattices[0].filter_fused(values, torch.empty_like(values), workspace, base=base)
        want = lattices[1].filter_fused(values, torch.empty_like(values), workspace, base=message, softmax=softmax,
                                        groups=groups)  # fmt: skip
        pair = permutohedral.pair_workspace(lattices, channels, torch.float32, DEVICE).fill_(float("nan"))
        got = permutohedral.filter_pair_fused(lattices, values, torch.empty_like(values), pair, base=base,
                                              softmax=softmax, groups=groups)  # fmt: skip
        if kernels.is_interpreted():
            assert torch.equal(got, want)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)  # compiled: fused multiply-adds may differ
        rows = [lattice.points + 1 for lattice in lattices]
        assert pair.shape[0] == min(rows[i] + max(rows[i], 2 * rows[1 - i]) for i in (0, 1))
        orders.add(permutohedral._pair_layout(lattices)[0])
    assert orders == {(0, 1), (1, 0)}


def images_and_probs(sizes, classes, seed=0):
    g = torch.Generator().manual_seed(seed)
    images = [torch.randint(0, 256, (*size, 3), generator=g, dtype=torch.uint8).numpy() for size in sizes]
    probs = [torch.rand(classes, *size, generator=g).softmax(0).to(DEVICE) for size in sizes]
    return images, probs


@pytest.mark.parametrize(
    ("sizes", "classes", "changes"),
    [
        ([(7, 9), (5, 6)], 3, {}),  # two images of one lattice, below 16 classes
        ([(6, 5)], 21, {"iterations": 3}),
        ([(4, 5)], 130, {"iterations": 2}),  # wider than one program's softmax: the softmax apart
        ([(6, 7)], 4, {"gaussian_compat": 0.0}),  # one kernel: its slice takes the prior and the softmax
        ([(6, 7)], 4, {"bilateral_compat": 0.0, "reference_padding": False}),
        ([(5, 5)], 2, {"gaussian_compat": 0.0, "bilateral_compat": 0.0}),  # no kernel: the softmax of the prior
    ],
)
def test_the_mean_field_equals_the_pytorch_products(sizes, classes, changes):
    cfg = dataclasses.replace(CrfConfig(iterations=2), **changes)
    images, probs = images_and_probs(sizes, classes)
    want = dense_crf_batch(images, probs, dataclasses.replace(cfg, kernel="torch"))
    got = dense_crf_batch(images, probs, dataclasses.replace(cfg, kernel="fused"))
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize(("directions", "blurs"), [(1, 9), (2, 5), (3, 3)])
def test_each_product_runs_in_the_kernel(directions, blurs, monkeypatch):
    """12 launches per iteration of the paper's CRF (a splat and 3 + 6 blurs per lattice, both slices in one launch
    that takes the softmax) and 13 for the kernels' normalisation; with 2 directions per blur launch 2 + 3 blurs (8
    and 9 launches), with 3 1 + 2 (6 and 7); no PyTorch sparse product, one softmax apart (the prior's)."""
    launches, softmaxes = [], []
    product, blur, softmax = kernels.product, kernels.blur, crf_module._softmax

    def counted(matrix, values, out, **options):
        launches.append("softmax" if options.get("softmax") else "product")
        return product(matrix, values, out, **options)

    def counted_blur(neighbours, values, out, **options):
        launches.append("blur")
        return blur(neighbours, values, out, **options)

    def refused(*args, **kwargs):
        raise AssertionError("a PyTorch sparse product in the fused mean-field")

    monkeypatch.setattr(kernels, "product", counted)
    monkeypatch.setattr(kernels, "blur", counted_blur)
    monkeypatch.setattr(crf_module, "_softmax", lambda *args: softmaxes.append(1) or softmax(*args))
    monkeypatch.setattr(permutohedral.Lattice, "filter", refused)
    images, probs = images_and_probs([(5, 6)], 21)
    dense_crf_batch(images, probs, CrfConfig(iterations=3, kernel="fused", blur_directions=directions))
    assert len(launches) == blurs + 4 + 3 * (blurs + 3) and launches.count("blur") == 4 * blurs
    assert launches.count("softmax") == 3 and launches[-1] == "softmax"
    assert len(softmaxes) == 1


@pytest.mark.parametrize(("size", "images", "classes"), [((48, 64), 1, 2), ((24, 32), 16, 81)])
def test_the_kernels_path_holds_no_more_memory_than_its_estimate(size, images, classes, monkeypatch):
    """Issue 37: the Triton path's estimate (KERNEL_BYTES_PER_PIXEL + KERNEL_BYTES_PER_PIXEL_AND_CLASS x classes),
    by which a GPU packs its runs, holds for the allocator's peak of a call on colour noise (the most lattice points),
    its marginals included: where the lattices' construction is the peak (2 classes) and where the mean-field's
    buffers are (a batch of small images at 81 classes, the most per pixel measured). On a GPU the compiled kernels
    and torch.cuda's peak; on the CPU the same path with the simplices kernel interpreted and the products' launches
    skipped (they write into buffers made before them: they allocate nothing)."""
    if DEVICE.type == "cpu":
        monkeypatch.setattr(kernels, "_product_kernel", SkippedLaunches())
        monkeypatch.setattr(kernels, "_blur_kernel", SkippedLaunches())
    rng = np.random.default_rng(0)
    pairs = [(rng.integers(0, 256, (*size, 3), dtype=np.uint8),
              torch.softmax(torch.randn(classes, *size, generator=torch.Generator().manual_seed(k)), 0).to(DEVICE))
             for k in range(images)]  # fmt: skip
    cfg = CrfConfig(kernel="fused", iterations=1)
    peak = peak_allocated(lambda: dense_crf_batch([i for i, _ in pairs], [p for _, p in pairs], cfg), DEVICE)
    pixels = images * size[0] * size[1]
    assert 0.8 * crf_module.estimated_bytes(pixels, classes, True) < peak <= crf_module.estimated_bytes(
        pixels, classes, True), peak / pixels


CALL_OPERATIONS = {"torch": (385, 15), "auto": (236, 15), "fused": (197, 12)}
"""Operations a CRF call dispatches (each Triton launch one; ``bench/bench_crf.py --launches``, docs/benchmarks.md;
``auto`` as on CUDA): to build the lattices and normalise the kernels, and per mean-field iteration, at 21 classes."""


@pytest.mark.parametrize("kernel", ["torch", "auto", "fused"])
def test_a_crf_call_dispatches_no_more_operations_than_counted(kernel, monkeypatch):
    """The ceilings of the table, on a 12 x 16 photograph's corner (the counts do not depend on the size); ``auto``
    as on CUDA (the simplices kernel, PyTorch's products) on any device; a GPU's uploads and reads back are
    transfers, counted apart (``OpCounter.transfers``: none on the CPU)."""
    skimage_data = pytest.importorskip("skimage.data", reason="scikit-image ships the photographs (dev requirement)")
    image = np.ascontiguousarray(skimage_data.astronaut()[100:124:2, 200:232:2])
    probs = torch.from_numpy(smooth_probs(image.shape[:2], 21, seed=5, cell=4)).to(DEVICE)
    finds = crf_module.finds_simplices_by_kernel
    counts = []
    for iterations in (0, 2):
        counter = OpCounter()
        for name in kernels.LAUNCHED:
            monkeypatch.setattr(kernels, name, counter.launches(getattr(kernels, name)))
        monkeypatch.setattr(crf_module, "finds_simplices_by_kernel", lambda cfg, device: finds(cfg, "cuda"))
        with counter:
            dense_crf(image, probs, CrfConfig(iterations=iterations, kernel=kernel))
        monkeypatch.undo()
        counts.append(sum(counter.counts.values()))
    build, per_iteration = CALL_OPERATIONS[kernel]
    assert counts[0] <= build and (counts[1] - counts[0]) / 2 <= per_iteration, counts


IMAGE_OPERATIONS = 12
"""Operations each further image of one size adds to a pool's batch in one mean-field run (``bench/bench_crf.py
--launches`` counts a call; docs/benchmarks.md "A CRF run's operations on a GPU"): its finiteness, unary, colour
features and labels; its positions are its size's."""


def test_each_image_of_a_run_dispatches_no_more_operations_than_counted():
    """``CrfPool.submit_batch`` in this process (as on a GPU) of 2 and 4 photographs' corners of one size, 21 classes,
    0 iterations (the iterations' operations are the run's): half the difference per image."""
    skimage_data = pytest.importorskip("skimage.data", reason="scikit-image ships the photographs (dev requirement)")
    photo = skimage_data.astronaut()
    images = [np.ascontiguousarray(photo[100 + 24 * k : 124 + 24 * k : 2, 200:232:2]) for k in range(4)]
    probs = [torch.from_numpy(smooth_probs(image.shape[:2], 21, seed=k, cell=4)).to(DEVICE)
             for k, image in enumerate(images)]  # fmt: skip
    counts = []
    for n in (2, 4):
        counter = OpCounter()
        with counter:
            futures = CrfPool(CrfConfig(iterations=0, kernel="torch")).submit_batch(images[:n], probs[:n])
        assert all(f.exception() is None for f in futures)
        counts.append(sum(counter.counts.values()))
    assert (counts[1] - counts[0]) / 2 <= IMAGE_OPERATIONS, counts


def test_the_stacks_softmax_is_taken_in_the_last_slice(monkeypatch):
    """The export's three stacks (crf_labels_stacked): an iteration is the 12 launches of one map, each stack's
    softmax in the slices' program, not apart."""
    skimage_data = pytest.importorskip("skimage.data", reason="scikit-image ships the photographs (dev requirement)")
    image = np.ascontiguousarray(skimage_data.astronaut()[100:124:2, 200:232:2])
    probs = torch.from_numpy(smooth_probs(image.shape[:2], 21, seed=5, cell=4)).to(DEVICE).view(3, 7, 12, 16)
    probs = probs / probs.sum(1, keepdim=True)
    counts = []
    for iterations in (0, 2):
        counter = OpCounter()
        for name in kernels.LAUNCHED:
            monkeypatch.setattr(kernels, name, counter.launches(getattr(kernels, name)))
        with counter:
            crf_labels_stacked(image, probs, CrfConfig(iterations=iterations, kernel="fused"))
        monkeypatch.undo()
        counts.append(sum(counter.counts.values()))
    assert (counts[1] - counts[0]) / 2 == CALL_OPERATIONS["fused"][1], counts


def test_the_fused_crf_matches_pydensecrf():
    """A photograph's corner with model-like probabilities: the parity of tests/inference/test_crf_parity.py."""
    skimage_data = pytest.importorskip("skimage.data", reason="scikit-image ships the photographs (dev requirement)")
    pytest.importorskip("pydensecrf.densecrf", reason="pydensecrf2 (the CRF oracle) is a dev requirement")
    image = np.ascontiguousarray(skimage_data.chelsea()[40:64:2, 100:132:2])
    probs = smooth_probs(image.shape[:2], 21, seed=4, cell=4)
    assert_same_crf(image, probs, CrfConfig(kernel="fused"), "chelsea", DEVICE)


def test_the_labels_and_the_stacked_labels_equal_the_pytorch_ones():
    """The argmax the tools write: one map, three stacks of one image (the export's, a softmax per stack in the last
    slice), and a GPU's batch of the export: two images of 6 and 3 classes per stack in one run (the second's stacks
    padded with absent classes)."""
    images, probs = images_and_probs([(9, 8), (7, 5)], 6, seed=5)
    stacked = torch.stack([probs[0], probs[0].flip(0), probs[0].roll(1, 0)])
    other = probs[1][:3] / probs[1][:3].sum(0)
    batch = [stacked, torch.stack([other, other.flip(0), other.roll(1, 0)])]
    labels = {}
    for kernel in ("torch", "fused"):
        cfg = CrfConfig(iterations=3, kernel=kernel)
        futures = CrfPool(cfg, workers=0).submit_stacked(images, batch)
        labels[kernel] = (crf_labels(images[0], probs[0], cfg), crf_labels_stacked(images[0], stacked, cfg),
                          *[torch.from_numpy(f.result()) for image_futures in futures for f in image_futures])
    assert len(labels["fused"]) == 8
    assert all(torch.equal(a, b) for a, b in zip(labels["fused"], labels["torch"], strict=True))
    for k in range(3):  # the batch's stacks are each image's own
        assert torch.equal(labels["torch"][2 + k], labels["torch"][1][k].cpu())


@pytest.mark.parametrize(
    ("kernel", "device", "expected"),
    [("auto", "cuda", False), ("auto", "cpu", False), ("fused", "cpu", True), ("fused", "cuda", True),
     ("torch", "cuda", False)],
)
def test_which_products_run(kernel, device, expected):
    assert uses_kernels(CrfConfig(kernel=kernel), device) is expected


def test_without_triton_auto_runs_pytorch_and_fused_says_why(monkeypatch):
    monkeypatch.setattr(permutohedral, "kernels", None)
    assert not uses_kernels(CrfConfig(), "cuda")
    with pytest.raises(ModuleNotFoundError, match="infer.crf.kernel='fused' needs the triton package"):
        uses_kernels(CrfConfig(kernel="fused"), "cuda")
