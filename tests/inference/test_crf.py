"""Dense CRF, both backends: cleans a noisy two-region label map, follows its config, equals pydensecrf called
directly on a colour image (RGB order, any memory layout, read-only arrays), the pool equals the serial run; the torch
backend runs without pydensecrf2, on the device of its tensors, many images per call. Parity on photographs, sizes
and constants: tests/inference/test_crf_parity.py."""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import sys

import numpy as np
import pytest
import torch

from tests.fake_cuda import fake_cuda, needs_fake_cuda
from wsss.config import CrfConfig
from wsss.inference.crf import CrfPool, crf_labels, dense_crf, dense_crf_batch

HAS_PYDENSECRF = importlib.util.find_spec("pydensecrf") is not None
BACKENDS = [
    "torch",
    pytest.param("pydensecrf", marks=pytest.mark.skipif(not HAS_PYDENSECRF, reason="pydensecrf2 not installed")),
]
TORCH_ATOL = 1e-5
"""Largest gap of the torch backend's marginals to pydensecrf's on these small cases (measured 5.2e-6: float32
summation order; test_crf_parity.py measures larger images)."""


def crf_cfg(backend: str, **kw) -> CrfConfig:
    return CrfConfig(backend=backend, **kw)


def two_region_case(seed: int = 0, height: int = 40, width: int = 60, flip_rate: float = 0.3):
    """Dark left half (class 0), bright right half (class 1); a unary that is wrong on ~30% of pixels."""
    rng = np.random.default_rng(seed)
    truth = np.zeros((height, width), dtype=np.uint8)
    truth[:, width // 2 :] = 1
    image = np.where(truth[..., None] == 1, 190, 60).astype(np.int16)
    image = np.clip(image + rng.integers(-8, 9, size=(height, width, 3)), 0, 255).astype(np.uint8)
    noisy = np.where(rng.random((height, width)) < flip_rate, 1 - truth, truth)
    p1 = np.where(noisy == 1, 0.65, 0.35).astype(np.float32)
    probs = np.stack([1 - p1, p1])
    return image, probs, truth


def colour_noise_case(seed: int = 0, height: int = 24, width: int = 32, classes: int = 3):
    """Independent uniform noise in each channel (so RGB and BGR differ everywhere) and random probabilities."""
    rng = np.random.default_rng(seed)
    image = rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    probs = rng.dirichlet(np.ones(classes), size=(height, width)).transpose(2, 0, 1)
    return image, np.ascontiguousarray(probs, dtype=np.float32)


def pydensecrf_reference(image: np.ndarray, probs: np.ndarray, cfg: CrfConfig) -> np.ndarray:
    """(C, H, W) marginals of pydensecrf called as its README does, with ``cfg``'s constants; ``image`` RGB."""
    dcrf = pytest.importorskip("pydensecrf.densecrf")
    from pydensecrf.utils import unary_from_softmax

    c, h, w = probs.shape
    crf = dcrf.DenseCRF2D(w, h, c)
    crf.setUnaryEnergy(unary_from_softmax(probs, clip=1e-5))
    crf.addPairwiseGaussian(sxy=cfg.gaussian_sxy, compat=cfg.gaussian_compat)
    crf.addPairwiseBilateral(sxy=cfg.bilateral_sxy, srgb=cfg.bilateral_srgb, rgbim=image, compat=cfg.bilateral_compat)
    return np.array(crf.inference(cfg.iterations), dtype=np.float32).reshape(c, h, w)


OTHER_CRF = CrfConfig(
    gaussian_sxy=3.0, gaussian_compat=2.0, bilateral_sxy=40.0, bilateral_srgb=13.0, bilateral_compat=6.0, iterations=4
)
"""Every constant other than the default (so that a constant passed to the wrong argument shows)."""


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cfg", [CrfConfig(), OTHER_CRF], ids=["default", "other"])
def test_crf_equals_pydensecrf_on_a_colour_image(cfg, backend):
    """The near-gray images of the other tests cannot tell the channel order; pydensecrf's lattice treats the
    channels unequally, so on colour noise BGR instead of RGB moves the marginals by up to 0.96."""
    image, probs = colour_noise_case()
    expected = pydensecrf_reference(image, probs, cfg)
    atol = 1e-6 if backend == "pydensecrf" else TORCH_ATOL
    np.testing.assert_allclose(dense_crf(image, probs, dataclasses.replace(cfg, backend=backend)), expected, rtol=0,
                               atol=atol)  # fmt: skip
    bgr = pydensecrf_reference(np.ascontiguousarray(image[..., ::-1]), probs, cfg)
    assert np.abs(bgr - expected).max() > 0.3  # the case does tell the channel order apart


@pytest.mark.parametrize("backend", BACKENDS)
def test_crf_takes_any_memory_layout(backend):
    """A view (a flipped or channel-reversed array, a crop) or a read-only array (``np.asarray`` of a PIL image)
    gives what its contiguous copy gives; pydensecrf itself refuses both ("ndarray is not C-contiguous", "buffer
    source array is read-only")."""
    cfg = crf_cfg(backend)
    image, probs = colour_noise_case(seed=1, width=40)
    read_only = image.copy()
    read_only.flags.writeable = False
    np.testing.assert_array_equal(dense_crf(read_only, probs, cfg), dense_crf(image, probs, cfg))
    bgr = np.ascontiguousarray(image[..., ::-1])
    padded = np.zeros((image.shape[0], image.shape[1] + 8, 3), np.uint8)
    padded[:, 4:-4] = image
    views = {"flipped": image[:, ::-1], "channels reversed": bgr[..., ::-1], "crop": padded[:, 4:-4]}
    for name, view in views.items():
        assert not view.flags.c_contiguous, name
        expected = dense_crf(np.ascontiguousarray(view), probs, cfg)
        np.testing.assert_array_equal(dense_crf(view, probs, cfg), expected, err_msg=name)
    np.testing.assert_array_equal(dense_crf(bgr[..., ::-1], probs, cfg), dense_crf(image, probs, cfg))
    probs_view = np.ascontiguousarray(probs[:, :, ::-1])[:, :, ::-1]  # the probabilities may be a view too
    np.testing.assert_array_equal(dense_crf(image, probs_view, cfg), dense_crf(image, probs, cfg))


@pytest.mark.parametrize("backend", BACKENDS)
def test_crf_cleans_a_noisy_unary(backend):
    image, probs, truth = two_region_case()
    before = (probs.argmax(0) == truth).mean()
    q = dense_crf(image, probs, crf_cfg(backend))
    assert q.shape == probs.shape and q.dtype == np.float32
    np.testing.assert_allclose(q.sum(axis=0), 1.0, atol=1e-5)
    after = (q.argmax(0) == truth).mean()
    assert 0.65 < before < 0.75
    assert after > 0.98, (before, after)
    np.testing.assert_array_equal(crf_labels(image, probs, crf_cfg(backend)), q.argmax(0))


@pytest.mark.parametrize("backend", BACKENDS)
def test_crf_follows_its_config(backend):
    image, probs, truth = two_region_case(seed=1)
    CrfConfig = functools.partial(crf_cfg, backend)  # noqa: N806 (the same calls for each backend)
    unary_only = crf_labels(image, probs, CrfConfig(iterations=0))
    np.testing.assert_array_equal(unary_only, probs.argmax(0))  # no message passing: the unary's argmax
    no_pairwise = crf_labels(image, probs, CrfConfig(gaussian_compat=0.0, bilateral_compat=0.0))
    np.testing.assert_array_equal(no_pairwise, probs.argmax(0))
    # The 1-px Gaussian kernel (compat 1) alone is too weak to overturn a 0.65 unary; the colour-aware
    # bilateral kernel does the cleaning.
    smooth_only = crf_labels(image, probs, CrfConfig(bilateral_compat=0.0))
    np.testing.assert_array_equal(smooth_only, probs.argmax(0))
    bilateral_only = crf_labels(image, probs, CrfConfig(gaussian_compat=0.0))
    assert (bilateral_only == truth).mean() > 0.98
    weak = crf_labels(image, probs, CrfConfig(bilateral_compat=0.5))
    assert (probs.argmax(0) == truth).mean() < (weak == truth).mean() < (bilateral_only == truth).mean()


def test_crf_rejects_mismatched_inputs():
    image, probs, _ = two_region_case()
    with pytest.raises(ValueError, match="dense_crf needs"):
        dense_crf(image[:, :-1], probs)


def test_pool_equals_serial():
    pytest.importorskip("pydensecrf.densecrf")
    cases = [two_region_case(seed=s, height=30 + 4 * s, width=50) for s in range(4)]
    cfg = CrfConfig(backend="pydensecrf", workers=2)
    serial = [crf_labels(image, probs, cfg) for image, probs, _ in cases]
    with CrfPool(cfg) as pool:
        assert pool.workers == 2
        futures = [pool.submit(image, probs) for image, probs, _ in cases]
        pooled = [f.result(timeout=120) for f in futures]
    for a, b in zip(serial, pooled, strict=True):
        np.testing.assert_array_equal(a, b)
    with CrfPool(cfg, workers=0) as inline:
        np.testing.assert_array_equal(inline.submit(*cases[0][:2]).result(), serial[0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_pool_reports_job_errors_through_the_future(backend):
    image, probs, _ = two_region_case()
    for workers in (1, 0):
        with CrfPool(crf_cfg(backend), workers=workers) as pool:
            bad, good = pool.submit_batch([image[:-1], image], [probs, probs])
            with pytest.raises(ValueError, match="dense_crf needs"):
                bad.result(timeout=120)
            np.testing.assert_array_equal(good.result(timeout=120), crf_labels(image, probs, crf_cfg(backend)))


def test_torch_batch_equals_one_image_at_a_time():
    """Images of other sizes and numbers of classes in one call: each as if alone (its own lattice; padded classes
    take no probability). A lattice shared across images would let one image's colours smooth another's. The gap
    (6.9e-6 measured) is float32 summation order: the sparse products block other numbers of columns otherwise."""
    cases = [colour_noise_case(seed=s, height=20 + 3 * s, width=31 - 2 * s, classes=2 + s) for s in range(4)]
    cases.append(two_region_case(seed=5)[:2])
    cfg = CrfConfig()
    alone = [dense_crf(image, probs, cfg) for image, probs in cases]
    batch = dense_crf_batch([i for i, _ in cases], [torch.from_numpy(p) for _, p in cases], cfg)
    for a, b in zip(alone, batch, strict=True):
        assert b.shape == a.shape
        np.testing.assert_allclose(b.numpy(), a, rtol=0, atol=TORCH_ATOL)
    with CrfPool(cfg) as pool:  # the pool of the torch backend: one batched call, no process
        assert pool.workers == 0 and pool._executor is None
        labels = [f.result() for f in pool.submit_batch([i for i, _ in cases], [p for _, p in cases])]
    for a, b in zip(alone, labels, strict=True):
        np.testing.assert_array_equal(b, a.argmax(0))


def test_torch_backend_keeps_tensors_on_their_device():
    image, probs = colour_noise_case(seed=2)
    q = dense_crf(torch.from_numpy(image), torch.from_numpy(probs), CrfConfig())
    assert isinstance(q, torch.Tensor) and q.dtype == torch.float32 and q.device == torch.device("cpu")
    np.testing.assert_array_equal(q.numpy(), dense_crf(image, probs, CrfConfig()))
    labels = crf_labels(image, torch.from_numpy(probs))
    assert isinstance(labels, torch.Tensor) and labels.dtype == torch.uint8
    np.testing.assert_array_equal(labels.numpy(), q.numpy().argmax(0))


def test_missing_package_names_it_and_torch_needs_none(monkeypatch):
    monkeypatch.setitem(sys.modules, "pydensecrf", None)
    monkeypatch.setitem(sys.modules, "pydensecrf.densecrf", None)
    image, probs, truth = two_region_case()
    with pytest.raises(ImportError, match="pydensecrf2.*infer.crf.backend=torch"):
        dense_crf(image, probs, CrfConfig(backend="pydensecrf"))
    with pytest.raises(ImportError, match="pydensecrf2"):
        CrfPool(CrfConfig(backend="pydensecrf"), workers=0)
    assert (crf_labels(image, probs) == truth).mean() > 0.98  # the default backend needs no compiled package
    with CrfPool(CrfConfig(workers=2)) as pool:
        assert (pool.submit(image, probs).result() == truth).mean() > 0.98


@needs_fake_cuda
def test_the_lattice_is_built_on_the_device_of_the_features():
    """On the emulated CUDA device (tests/fake_cuda.py) every step of the lattice construction keeps to ``cuda``
    and gives the CPU's lattice; the sparse products that follow cannot run there (no sparse layouts in
    FakeTensorMode) and are compared with the CPU on a real GPU by `make gpu-check`."""
    from wsss.inference import permutohedral as lattice

    image, _ = colour_noise_case(seed=3)
    xy = torch.stack(torch.meshgrid(torch.arange(24.0), torch.arange(32.0), indexing="ij")[::-1], -1).reshape(-1, 2)
    features = torch.cat([xy / 121.0, torch.from_numpy(image).reshape(-1, 3).float() / 5.0], dim=1)
    segments = torch.arange(2).repeat_interleave(features.shape[0] // 2)

    def steps(f: torch.Tensor, seg: torch.Tensor):
        elevated = lattice._elevate(f)
        rem0, rank = lattice._enclosing_simplex(elevated)
        weights = lattice._barycentric(elevated, rem0, rank)
        keys = torch.cat([seg[:, None], rem0[:, :5] + rank[:, :5]], dim=1)  # lattice-like keys, one per point
        order, vertex, neighbours, m = lattice._index_keys(keys, 5, offset=1)
        return [weights, rem0, rank, order, vertex, *[n for pair in neighbours for n in pair]], m

    want, m = steps(features, segments)
    with fake_cuda():
        got, m_cuda = steps(features.to("cuda"), segments.to("cuda"))
        assert all(t.device.type == "cuda" for t in got)
        got = [t.cpu() for t in got]
    assert m_cuda == m
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_an_autocast_region_around_the_call_changes_nothing():
    """A caller inside bf16 autocast (as a training step is) still gets the float32 CRF."""
    image, probs = colour_noise_case(seed=4)
    want = dense_crf(image, torch.from_numpy(probs))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = dense_crf(image, torch.from_numpy(probs))
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=0, atol=0)
