"""The energy's ``W S`` by the reference's permutohedral lattice (``loss.reg_kernel="lattice"``): the loss and its
gradient against the same formula computed image by image, the codes fixed in advance (a CUDA graph can capture
the build) against the codes read back, on the emulated CUDA device without a host read, and the Triton kernels
(interpreted here) against PyTorch's products.

The lattice itself is pydensecrf's (tests/inference/test_crf_parity.py) and rloss's: ToCo e13514d's
``DenseEnergyLoss`` with rloss 1caa759's ``bilateralfilter``, built outside this repository, gave the loss of
``DenseEnergyLoss(kernel="lattice")`` to 7.7e-6 and its gradient to 2.9e-7 of its largest entry on four 448 crops of
photographs (docs/reference.md, "Energy-loss calibration").
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from skimage import data
from torch import Tensor

from tests.fake_cuda import fake_cuda, needs_fake_cuda, no_sync, raises_host_sync
from tests.triton_interpreter import needs_kernel
from wsss import losses
from wsss.config import LossConfig
from wsss.inference.crf import kernels, permutohedral
from wsss.inference.crf.permutohedral import build_lattice, fixed_box
from wsss.losses import DenseEnergyLoss, bilateral_features, dense_energy, lattice_filter
from wsss.utils.op_count import OpCounter

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
"""Where the Triton kernels run: compiled on a GPU, else in Triton's interpreter (``TRITON_INTERPRET=1``, set in
conftest.py)."""

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.filterwarnings("ignore:Sparse CSR tensor support")]

SIGMA_RGB, SIGMA_XY = 15.0, 7.0


def photo_crops(size: tuple[int, int]) -> torch.Tensor:
    """Two photographs (astronaut, chelsea) cropped to ``size``, (2, 3, h, w) float32 in 0..255, the first rows a
    dark grey (15: one colour sigma from black) where the SSE build's padding point (feature 0) adds lattice points
    that relay the blur: at 23 x 21 the first image's filter moves by 3.3e-3 of its largest value with it."""
    crops = [torch.from_numpy(p[100 : 100 + size[0], 150 : 150 + size[1]].copy()) for p in (data.astronaut(),
                                                                                          data.chelsea())]  # fmt: skip
    images = torch.stack(crops).permute(0, 3, 1, 2).float()
    images[:, :, :3] = 15.0
    return images


def softmax_maps(size: tuple[int, int], classes: int = 4, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(2, classes, 4, 4, generator=g) * 3
    return F.interpolate(logits, size=size, mode="bilinear", align_corners=False).softmax(dim=1)


def box_for(size: tuple[int, int], device: torch.device | str = "cpu") -> permutohedral.FixedBox:
    """The box of two crops of ``size`` (:meth:`DenseEnergyLoss._box`'s)."""
    return DenseEnergyLoss(1e-7, SIGMA_RGB, SIGMA_XY, 1.0, 255, "lattice")._box(2, size, torch.device(device))


@pytest.mark.parametrize("size", [(24, 20), (23, 21)])  # 23 x 21 pixels: pydensecrf's SSE build pads each image
def test_the_lattice_energy_is_the_formula_image_by_image(size):
    """``E = -(1/B) sum g S . (W S)`` and ToCo's gradient ``-(2/B) g W S``, ``W S`` by one lattice per image (its
    points the whole grid's, ``S`` zeroed outside the roi), each image filtered on its own here."""
    images, probs = photo_crops(size), softmax_maps(size).requires_grad_(True)
    roi = torch.ones(2, *size, dtype=torch.bool)
    roi[1, :, :5] = False
    gate = 1.0 - probs.detach().amax(dim=1)
    gate[0, :3] = 1.0
    features = bilateral_features(images, SIGMA_RGB, SIGMA_XY)
    energy = dense_energy(probs, features, "lattice", roi, gate * roi)
    (grad,) = torch.autograd.grad(energy, probs)

    s_all = (probs.detach() * roi[:, None]).flatten(2).transpose(1, 2)  # (2, n, K)
    one_by_one = [build_lattice(features[i].flatten(1).T.contiguous(), reference_padding=True) for i in range(2)]
    ws = torch.stack([lattice.filter(s) for lattice, s in zip(one_by_one, s_all, strict=True)])
    gws = (gate * roi).flatten(1)[..., None] * ws
    want = -(s_all * gws).sum(dtype=torch.float64) / 2
    torch.testing.assert_close(energy.double(), want, rtol=1e-6, atol=0)
    torch.testing.assert_close(grad, (-2.0 / 2) * gws.transpose(1, 2).reshape(probs.shape), rtol=1e-5, atol=1e-7)

    # the comparison can fail: the SSE build's padding dropped, the images' lattices shared
    if size[0] * size[1] % 4:
        unpadded = build_lattice(features[0].flatten(1).T.contiguous()).filter(s_all[0])
        assert (unpadded - ws[0]).abs().max() > 1e-3 * ws[0].abs().max()
    shared = lattice_filter(features.flatten(2).transpose(1, 2).reshape(1, -1, 5), s_all.reshape(1, -1, 4))
    assert (shared.view_as(ws) - ws).abs().max() > 1e-3 * ws.abs().max()


@needs_kernel
def test_the_gpu_s_path_of_the_lattice_loss_equals_the_cpu_s():
    """``DenseEnergyLoss`` with the lattice's Triton kernels and codes fixed from the crop size (a GPU's path; here
    on ``DEVICE``) against PyTorch's products with the codes read back: value and gradient to float32 rounding; and
    a crop of another size takes a box of its own."""
    loss = DenseEnergyLoss(1e-7, SIGMA_RGB, SIGMA_XY, 1.0, 255, "lattice")
    results = {}
    for size in ((23, 21), (16, 20)):
        images, probs = photo_crops(size), softmax_maps(size)
        label = probs.argmax(dim=1)
        label[:, :2] = 255
        valid = torch.ones(2, *size, dtype=torch.bool)
        valid[1, -4:] = False
        for gpu_path in (False, True):
            loss.lattice_kernels = gpu_path
            device = DEVICE if gpu_path else torch.device("cpu")
            p = probs.to(device).requires_grad_(True)
            value = loss(images.to(device), p, valid.to(device), label.to(device))
            value.backward()
            results[size, gpu_path] = value.detach().cpu(), p.grad.cpu()
        (value_cpu, grad_cpu), (value_gpu, grad_gpu) = results[size, False], results[size, True]
        torch.testing.assert_close(value_gpu, value_cpu, rtol=1e-5, atol=0)
        torch.testing.assert_close(grad_gpu, grad_cpu, rtol=1e-4, atol=1e-5 * grad_cpu.abs().max().item())
    assert len(loss._boxes) == 2 and {key[1] for key in loss._boxes} == {(23, 21), (16, 20)}


def as_cuda_divides(images: Tensor, sigma_rgb: float, sigma_xy: float) -> Tensor:
    """:func:`bilateral_features` with the positions divided as CUDA divides a tensor by a number: the product with
    the number's float32 reciprocal (PyTorch's ``div_true_kernel_cuda``), one ulp above the quotient at times."""
    features = bilateral_features(images, sigma_rgb, sigma_xy)
    h, w = images.shape[-2:]
    ys, xs = torch.meshgrid(torch.arange(h, dtype=torch.float32), torch.arange(w, dtype=torch.float32), indexing="ij")
    reciprocal = torch.tensor(1.0) / sigma_xy
    features[:, 0], features[:, 1] = (xs * reciprocal).to(images.device), (ys * reciprocal).to(images.device)
    return features


@needs_kernel
def test_the_gpu_s_box_holds_the_positions_a_gpu_divides(monkeypatch):
    """On an H200 the GPU's path of the lattice loss gave NaN: 19 * (1/7) > 19/7 and 22 * (1/7) > 22/7 in float32, so
    the last column of a 16 x 20 crop and the last row of a 23 x 21 one lay past the box's bounds at sigma 7. With
    those positions the loss on the GPU's path (here on ``DEVICE``) is finite and equals the CPU's path."""
    monkeypatch.setattr(losses, "bilateral_features", as_cuda_divides)
    loss = DenseEnergyLoss(1e-7, SIGMA_RGB, SIGMA_XY, 1.0, 255, "lattice")
    for size in ((16, 20), (23, 21)):
        images, probs = photo_crops(size), softmax_maps(size)
        last = as_cuda_divides(images, SIGMA_RGB, SIGMA_XY)[0, :2, -1, -1]
        assert (last > torch.tensor([size[1] - 1, size[0] - 1]) / SIGMA_XY).any()  # what the test is about
        values = []
        for gpu_path in (False, True):
            loss.lattice_kernels = gpu_path
            device = DEVICE if gpu_path else torch.device("cpu")
            values.append(loss(images.to(device), probs.to(device), None, probs.argmax(dim=1).to(device)).cpu())
        assert values[1].isfinite()
        torch.testing.assert_close(values[1], values[0], rtol=1e-5, atol=0)


LOSS_OPERATIONS = (117, 6)
"""Operations the lattice loss dispatches on a GPU's path (each Triton launch one), forward and backward (the
forward 116 before the real points were counted); the training step's energy stage (``bench/op_counts.py``, 128)
adds what surrounds the loss in the step, the logits' resize among it."""


@needs_kernel
def test_the_gpu_s_lattice_loss_dispatches_no_more_operations_than_counted(monkeypatch):
    """The ceilings, on two 24 x 20 crops with 21 classes (the counts do not depend on the size), after the first
    call (which uploads the codes' constants)."""
    loss = DenseEnergyLoss(1e-7, SIGMA_RGB, SIGMA_XY, 0.5, 255, "lattice", lattice_kernels=True)
    size = (24, 20)
    images, probs = photo_crops(size).to(DEVICE), softmax_maps(size, classes=21).to(DEVICE)
    label = probs.argmax(dim=1)
    loss(images, probs, None, label)
    counter = OpCounter()
    for name in kernels.LAUNCHED:
        monkeypatch.setattr(kernels, name, counter.launches(getattr(kernels, name)))
    p = probs.clone().requires_grad_(True)
    with counter:
        value = loss(images, p, None, label)
        with counter.stage("backward"):
            value.backward()
    assert counter.counts["other"] <= LOSS_OPERATIONS[0] and counter.counts["backward"] <= LOSS_OPERATIONS[1], (
        counter.counts)


def test_the_lattice_weight_is_toco_s_and_the_exact_kernels_are_matched():
    """The default is the reference's lattice at ToCo's 1e-7; ``reg_lattice_match`` scales the exact kernels to the
    lattice's strength."""
    lattice = DenseEnergyLoss.from_config(LossConfig(), 255)
    assert lattice.weight == 1e-7 and lattice.kernel == "lattice"
    for kernel in ("auto", "fused", "blocked"):
        exact = DenseEnergyLoss.from_config(LossConfig(reg_kernel=kernel), 255)
        assert exact.weight == pytest.approx(1e-7 * 0.59) and exact.kernel == kernel


@needs_kernel
@pytest.mark.parametrize("size", [(24, 20), (23, 21)])
@pytest.mark.parametrize("fused", [False, True])
def test_codes_fixed_in_advance_filter_as_the_codes_read_back(size, fused):
    """A fixed box numbers the lattice's real points as the codes read back do and adds empty ones: the same
    values, to the bit on the CPU (the kernels against PyTorch's products to float32 rounding)."""
    device = DEVICE if fused else torch.device("cpu")
    features = bilateral_features(photo_crops(size), SIGMA_RGB, SIGMA_XY).flatten(2).transpose(1, 2).to(device)
    values = softmax_maps(size).flatten(2).transpose(1, 2).to(device)
    box = box_for(size, device)
    read_back = lattice_filter(features, values, fused=False)
    fixed = lattice_filter(features, values, box, fused=fused)
    if fused:
        torch.testing.assert_close(fixed, read_back, rtol=1e-5, atol=1e-5)
    else:
        assert torch.equal(fixed, read_back)
    flat = features.reshape(-1, 5).contiguous()
    lattice = build_lattice(flat, [size[0] * size[1]] * 2, reference_padding=True, fused=fused, box=box)
    assert lattice.points == features.shape[0] * features.shape[1] * 6 + (12 if size[0] * size[1] % 4 else 0)


@needs_kernel
@pytest.mark.parametrize("size", [(24, 20), (23, 21)])
def test_the_kernels_stop_at_a_fixed_box_s_real_points(size):
    """A fixed box's lattice counts its real points on the device (as many as the codes read back find), and its
    splat and blur kernels stop there: the rows of the empty points after them (7 and 9 in the two buffers here)
    are neither read nor written, and the filter is the read-back lattice's to the bit."""
    flat = bilateral_features(photo_crops(size), SIGMA_RGB, SIGMA_XY).flatten(2).transpose(1, 2).reshape(-1, 5)
    values = softmax_maps(size).flatten(2).transpose(1, 2).reshape(-1, 4).contiguous().to(DEVICE)
    flat, sizes = flat.contiguous().to(DEVICE), [size[0] * size[1]] * 2
    read_back = build_lattice(flat, sizes, reference_padding=True, fused=True)
    fixed = build_lattice(flat, sizes, reference_padding=True, fused=True, box=box_for(size, DEVICE))
    assert read_back.live is None and fixed.live.tolist() == [read_back.points] and fixed.points > 5 * read_back.points
    workspace = torch.tensor([7.0, 9.0], device=DEVICE)[:, None, None].repeat(1, fixed.points + 1, 4)
    got = fixed.filter_fused(values, torch.empty_like(values), workspace)
    want = read_back.filter_fused(values, torch.empty_like(values), torch.zeros_like(workspace))
    assert torch.equal(got, want)
    empty = workspace[:, read_back.points + 1 :]
    assert (empty[0] == 7.0).all() and (empty[1] == 9.0).all()


def test_a_fixed_box_holds_features_anywhere_within_its_bounds():
    """Features at the bounds' corners and spread over them: the box's codes give the lattice of the codes read
    back (a box too small for them would make two keys share a code, or a code wrap)."""
    g = torch.Generator().manual_seed(3)
    low, high = [-2.0, 0.0, 1.0, -5.0, 0.0], [3.0, 4.0, 9.0, 5.0, 0.5]
    span = torch.tensor(high) - torch.tensor(low)
    corners = torch.tensor([[(c >> j) & 1 for j in range(5)] for c in range(32)], dtype=torch.float32)
    features = torch.cat([corners, torch.rand(400, 5, generator=g)]) * span + torch.tensor(low)
    values = torch.rand(2, features.shape[0] // 2, 3, generator=g)
    features = features.view(2, -1, 5)
    box = fixed_box(low, high, 2, "cpu")
    read_back = lattice_filter(features, values, fused=False)
    assert torch.equal(lattice_filter(features, values, box, fused=False), read_back)
    outside = features.clone()
    outside[1, 7, 2] = high[2] + 0.01  # a feature past the bounds: the whole result NaN, not a wrong lattice
    assert lattice_filter(outside, values, box, fused=False).isnan().all()


def test_the_remainder_range_of_bounds_holds_their_corners_tightly():
    """The remainder-0 points of features at the bounds' 32 corners (the extremes of every elevated coordinate, a
    linear map of the features) and between them lie within :func:`permutohedral._remainder_range`, which is no
    wider than their own range plus its margins."""
    g = torch.Generator().manual_seed(4)
    low, high = [-2.0, 0.0, 1.0, -5.0, 0.0], [3.0, 4.0, 9.0, 5.0, 0.5]
    corners = torch.tensor([[(c >> j) & 1 for j in range(5)] for c in range(32)], dtype=torch.float32)
    unit = torch.cat([corners, torch.rand(2000, 5, generator=g)])
    features = unit * (torch.tensor(high) - torch.tensor(low)) + torch.tensor(low)
    elevated = permutohedral._elevate(features)
    rem0, _ = permutohedral._enclosing_simplex(elevated)
    margin = 1 + 1.5 * 6
    for j, (lowest, highest) in enumerate(permutohedral._remainder_range(low, high)):
        assert lowest <= rem0[:, j].min() and rem0[:, j].max() <= highest, j
        assert elevated[:, j].min() - margin - 1 <= lowest and highest <= elevated[:, j].max() + margin + 1, j


def test_bounds_too_wide_for_one_code_are_refused():
    with pytest.raises(ValueError, match="narrower bounds"):
        fixed_box([0.0] * 5, [1e4] * 5, 4, "cpu")


@needs_fake_cuda
def test_the_fixed_build_reads_nothing_back_on_the_emulated_device(monkeypatch):
    """The build with a fixed box on the emulated CUDA device (up to the CSR matrices, which the emulator cannot
    make) in a no-sync region; the codes read back from the features' range sync there."""
    monkeypatch.setattr(permutohedral, "_csr", lambda crow, cols, values, size, dtype: (crow, cols, values))
    size = (23, 21)
    features = bilateral_features(photo_crops(size), SIGMA_RGB, SIGMA_XY).flatten(2).transpose(1, 2).reshape(-1, 5)
    with fake_cuda() as mode:
        box = box_for(size, "cuda")
        on_device = features.contiguous().to("cuda")
        with no_sync(mode):
            lattice = build_lattice(on_device, [size[0] * size[1]] * 2, reference_padding=True, box=box)
            assert lattice.points == on_device.shape[0] * 6 + 12
            with raises_host_sync():
                build_lattice(on_device, [size[0] * size[1]] * 2, reference_padding=True)
