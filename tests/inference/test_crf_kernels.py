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
from wsss.config import CrfConfig
from wsss.inference import crf as crf_module
from wsss.inference.crf import crf_labels, crf_labels_stacked, dense_crf_batch, kernels, permutohedral, uses_kernels

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")

pytestmark = pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta state")


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
        (300, [0, 3, 1, 17, 2], 5, False, False),  # empty rows, one row much longer than its block's others
        (70, [3], 33, True, False),  # two channel blocks
        (9, [6], 81, True, True),  # COCO's classes, the softmax over a 128-wide row
        (40, [1, 2], 1, True, True),  # one channel: the softmax is 1
        (513, [2], 21, False, True),  # a last block of one row
    ],
)
def test_a_product_is_the_dense_product(rows, lengths, channels, with_base, softmax):
    """Against the dense float64 product, the base added and the softmax taken per row, rows of 0 to 17 entries."""
    matrix = csr(rows, 50, lengths, seed=rows)
    g = torch.Generator().manual_seed(1)
    values = torch.randn(60, channels, generator=g).to(DEVICE)  # more rows than the matrix has columns
    base = torch.randn(rows, channels, generator=g).to(DEVICE) if with_base else None
    out = torch.full((rows, channels), float("nan"), device=DEVICE)
    got = kernels.product(matrix, values, out, base=base, softmax=softmax)
    want = matrix.to_dense().double() @ values[:50].double() + (0 if base is None else base.double())
    if softmax:
        want = want.softmax(1)
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
    with pytest.raises(ValueError, match="at most 128 channels, got 129"):
        kernels.product(matrix, torch.randn(8, 129, device=DEVICE), torch.empty(10, 129, device=DEVICE), softmax=True)
    with pytest.raises(ValueError, match=r"cannot take \(10, 8\) @ \(7, 3\) into \(10, 3\)"):
        kernels.product(matrix, values[:7], out)
    with pytest.raises(ValueError, match="float32 values and contiguous"):
        kernels.product(matrix, values.double(), out)
    with pytest.raises(ValueError, match="float32 values and contiguous"):
        kernels.product(matrix, torch.randn(3, 8, device=DEVICE).T, out)


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


def test_each_product_runs_in_the_kernel(monkeypatch):
    """13 launches per iteration of the paper's CRF (a splat, 3 + 6 blurs, a slice per lattice; the last slice takes
    the softmax) and 13 for the kernels' normalisation; no PyTorch sparse product, one softmax apart (the prior's)."""
    launches, softmaxes = [], []
    product, softmax = kernels.product, crf_module._softmax

    def counted(matrix, values, out, base=None, softmax=False):
        launches.append(softmax)
        return product(matrix, values, out, base=base, softmax=softmax)

    def refused(*args, **kwargs):
        raise AssertionError("a PyTorch sparse product in the fused mean-field")

    monkeypatch.setattr(kernels, "product", counted)
    monkeypatch.setattr(crf_module, "_softmax", lambda *args: softmaxes.append(1) or softmax(*args))
    monkeypatch.setattr(permutohedral.Lattice, "filter", refused)
    images, probs = images_and_probs([(5, 6)], 21)
    dense_crf_batch(images, probs, CrfConfig(iterations=3, kernel="fused"))
    assert len(launches) == 13 + 3 * 13
    assert launches.count(True) == 3 and launches[-1]
    assert len(softmaxes) == 1


def test_the_fused_crf_matches_pydensecrf():
    """A photograph's corner with model-like probabilities: the parity of tests/inference/test_crf_parity.py."""
    skimage_data = pytest.importorskip("skimage.data", reason="scikit-image ships the photographs (dev requirement)")
    pytest.importorskip("pydensecrf.densecrf", reason="pydensecrf2 (the CRF oracle) is a dev requirement")
    image = np.ascontiguousarray(skimage_data.chelsea()[40:64:2, 100:132:2])
    assert_same_crf(image, smooth_probs(image.shape[:2], 21, seed=4, cell=4), CrfConfig(kernel="fused"), "chelsea")


def test_the_labels_and_the_stacked_labels_equal_the_pytorch_ones():
    """The argmax the tools write: one map, and three stacks of one image (the export's, a softmax per stack)."""
    images, probs = images_and_probs([(9, 8)], 6, seed=5)
    stacked = torch.stack([probs[0], probs[0].flip(0), probs[0].roll(1, 0)])
    labels = {}
    for kernel in ("torch", "fused"):
        cfg = CrfConfig(iterations=3, kernel=kernel)
        labels[kernel] = crf_labels(images[0], probs[0], cfg), crf_labels_stacked(images[0], stacked, cfg)
    assert all(torch.equal(a, b) for a, b in zip(labels["fused"], labels["torch"], strict=True))


@pytest.mark.parametrize(
    ("kernel", "device", "expected"),
    [("auto", "cuda", True), ("auto", "cpu", False), ("fused", "cpu", True), ("torch", "cuda", False)],
)
def test_which_products_run(kernel, device, expected):
    assert uses_kernels(CrfConfig(kernel=kernel), device) is expected


def test_without_triton_auto_runs_pytorch_and_fused_says_why(monkeypatch):
    monkeypatch.setattr(permutohedral, "kernels", None)
    assert not uses_kernels(CrfConfig(), "cuda")
    with pytest.raises(ModuleNotFoundError, match="infer.crf.kernel='fused' needs the triton package"):
        uses_kernels(CrfConfig(kernel="fused"), "cuda")
