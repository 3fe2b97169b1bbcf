"""PAR's Triton kernels (:mod:`wsss.par_kernel`) against its PyTorch path and a float64 pixel loop.

Without a GPU the kernels run in Triton's CPU interpreter (``TRITON_INTERPRET=1``, set in ``conftest.py``); on a GPU
the same tests run the compiled kernels on CUDA tensors.
"""

from __future__ import annotations

import pytest
import torch

from tests.fake_cuda import fake_cuda
from tests.test_par import reference_par
from wsss import par as par_module
from wsss import par_kernel
from wsss.config import ParConfig
from wsss.par import PAR

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def pars(dilations, num_iter: int = 10) -> tuple[PAR, PAR]:
    return tuple(PAR.from_config(ParConfig(dilations=dilations, num_iter=num_iter, kernel=kernel)).to(DEVICE)
                 for kernel in ("torch", "fused"))  # fmt: skip


def guidance(b: int, h: int, w: int, seed: int = 0) -> torch.Tensor:
    """Random colours with an edge and a flat patch (equal neighbours: a zero standard deviation)."""
    g = torch.Generator().manual_seed(seed)
    images = torch.rand(b, 3, h, w, generator=g)
    images[..., :, : w // 2] *= 0.3
    images[..., : h // 3, : w // 3] = 0.5
    return images.to(DEVICE)


@pytest.mark.parametrize(("dilations", "size"), [((1, 2, 4, 8, 12, 24), (37, 45)), ((1, 3), (9, 7)),
                                                  ((2, 5, 9), (3, 130)), ((1,), (1, 1))])  # fmt: skip
def test_the_affinities_equal_the_pytorch_path(dilations, size):
    """Images smaller than a dilation (every neighbour clamped), a row of more than one block, one pixel."""
    torch_par, fused_par = pars(dilations)
    images = guidance(2, *size)
    want = torch_par.affinity(images)
    got = fused_par.affinity(images)
    assert got.shape == want.shape == (2, 8 * len(dilations), *size)
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize(("channels", "num_iter"), [(1, 3), (6, 10), (21, 2), (4, 0), (3, 1)])
def test_the_propagation_equals_the_pytorch_path(channels, num_iter):
    """Channels in two blocks (21 > 16), one step and none; the input is left as it was."""
    torch_par, fused_par = pars((1, 2, 4, 8), num_iter)
    images = guidance(2, 23, 29, seed=1)
    masks = torch.rand(2, channels, 23, 29, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    kept = masks.clone()
    affinity = torch_par.affinity(images)
    want = torch_par.propagate(affinity, masks)
    got = fused_par.propagate(affinity, masks)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert torch.equal(masks, kept)


def test_the_fused_par_equals_the_pixel_loop():
    """Affinities and steps together against the float64 loop of tests/test_par.py."""
    _, fused_par = pars((1, 2, 3), num_iter=2)
    images = guidance(2, 12, 10, seed=3).double()
    masks = torch.rand(2, 4, 12, 10, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    out = fused_par(images.float(), masks).cpu()
    for b in range(2):
        ref = reference_par(images[b].cpu().tolist(), masks[b].cpu().double().tolist(), (1, 2, 3), 2, 0.3, 0.01)
        torch.testing.assert_close(out[b].double(), torch.tensor(ref, dtype=torch.float64), rtol=1e-5, atol=1e-6)


def test_the_fused_pseudo_labels_equal_the_pytorch_ones():
    """The paper's PAR (6 dilations, 10 steps) on two score stacks: the argmax the training step takes."""
    torch_par, fused_par = pars((1, 2, 4, 8, 12, 24))
    images = guidance(2, 24, 24, seed=5)
    masks = torch.rand(2, 6, 24, 24, generator=torch.Generator().manual_seed(6)).to(DEVICE).softmax(1)
    want, got = torch_par(images, masks), fused_par(images, masks)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert torch.equal(got.argmax(1), want.argmax(1))


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_auto_takes_the_kernels_exactly_for_cuda_tensors(monkeypatch, device):
    """``par.kernel="auto"``: the kernels for CUDA tensors, PyTorch otherwise. The kernels cannot run on the emulated
    device's tensors (Triton needs device memory); stand-ins record the calls and answer with the PyTorch path."""
    calls = []
    reference = PAR.from_config(ParConfig(num_iter=2, kernel="torch"))

    def affinity(images, *args):
        calls.append(("affinity", images.device.type))
        return reference.affinity(images)

    def propagate(affinity, masks, *args):
        calls.append(("propagate", masks.device.type))
        return reference.propagate(affinity, masks)

    monkeypatch.setattr(par_kernel, "affinity", affinity)
    monkeypatch.setattr(par_kernel, "propagate", propagate)
    images, masks = guidance(1, 8, 9).cpu(), torch.rand(1, 2, 8, 9)
    with fake_cuda():
        out = PAR.from_config(ParConfig(num_iter=2)).to(device)(images.to(device), masks.to(device)).cpu()
    assert calls == ([("affinity", "cuda"), ("propagate", "cuda")] if device == "cuda" else [])
    torch.testing.assert_close(out, reference(images, masks))


def test_inputs_on_two_devices_are_refused_before_any_launch():
    """A PAR module left on the CPU with CUDA images would hand the kernels a host pointer: one line says so."""
    _, fused_par = pars((1, 2))
    images, masks = guidance(1, 6, 7), torch.rand(1, 2, 6, 7, device=DEVICE)
    with pytest.raises(ValueError, match=r"on one device, got .*meta.*PAR.to\(device\)"):
        par_kernel.affinity(images, fused_par.dy.to("meta"), fused_par.dx, fused_par.position, 0.3, 1e-8)
    with pytest.raises(ValueError, match="on one device"):
        par_kernel.propagate(fused_par.affinity(images).to("meta"), masks, fused_par.dy, fused_par.dx, 2)


def test_a_fused_par_needs_triton(monkeypatch):
    monkeypatch.setattr(par_module, "par_kernel", None)
    with pytest.raises(ModuleNotFoundError, match="needs the triton package"):
        PAR.from_config(ParConfig(kernel="fused"))
    assert not PAR.from_config(ParConfig()).fused_for(torch.zeros(1))
