"""The emulated CUDA device of tests/fake_cuda.py is as strict as FakeTensorMode, and its values and gradients are
the CPU's. Where a GPU is visible, the tests of the device's rules run on the real device (which is what the emulator
claims to copy); those of the emulator's own machinery skip (:data:`tests.fake_cuda.emulator_only`)."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from tests.fake_cuda import emulator_only, fake_cuda, graph_backward, needs_fake_cuda, no_sync, raises_host_sync
from wsss.utils.tensors import to_device

HOST_READS = {
    "item": lambda y: y.sum().item(),
    "bool": lambda y: bool(y.sum() > 0),
    "cpu": lambda y: y.cpu(),
    "tolist": lambda y: y.tolist(),
    "nonzero": lambda y: y.nonzero(),
    "mask index": lambda y: y[y > 0],
    "bincount": lambda y: torch.bincount(y.argmax(dim=1)),
    "unique": lambda y: torch.unique(y.argmax(dim=1)),
}


@needs_fake_cuda
@emulator_only
def test_a_cpu_tensor_meeting_a_cuda_one_raises_as_under_fake_tensor_mode():
    with FakeTensorMode(), pytest.raises(RuntimeError) as plain:
        torch.empty(4, 4, device="cuda") + torch.ones(4, 4)
    with fake_cuda(), pytest.raises(RuntimeError) as ours:
        torch.empty(4, 4, device="cuda") + torch.ones(4, 4)
    assert type(ours.value) is type(plain.value)
    assert "cuda:0 and cpu" in str(ours.value) or "cuda:0, cpu" in str(ours.value)  # torch 2.15 or 2.11
    with fake_cuda():  # as on a GPU, a 0-dim CPU tensor is a scalar and may meet a cuda tensor
        assert (torch.ones(2, device="cuda") + torch.tensor(1.0, device="cpu")).device.type == "cuda"


@needs_fake_cuda
@pytest.mark.parametrize("read", sorted(HOST_READS))
def test_host_reads_raise_in_a_no_sync_region_and_give_values_outside(read):
    x = torch.arange(12, dtype=torch.float32).view(4, 3) - 5
    want = HOST_READS[read](x)
    with fake_cuda() as mode:
        y = x.to("cuda")
        with no_sync(mode), raises_host_sync():
            HOST_READS[read](y)
        got = HOST_READS[read](y)
        got = got.cpu() if isinstance(got, torch.Tensor) else got
    assert torch.equal(got, want) if isinstance(want, torch.Tensor) else got == want


@needs_fake_cuda
def test_indexing_with_integer_device_indices_waits_for_nothing():
    """An integer index's output has the index's shape: no host read (a boolean mask's is a sync, above), and a value
    on the device is written through one without a wait. A Python number written through one is a blocking upload
    (Python's setitem makes it a CPU tensor for a cuda tensor, which the CUDA index put copies to the device): a sync,
    read in PyTorch's source after the former version of this test failed on an H200 (2026-11-28)."""
    x = torch.arange(12, dtype=torch.float32).view(4, 3) - 5
    rows = torch.tensor([3, 0, 3])
    with fake_cuda() as mode:
        y, index = x.to("cuda"), rows.to("cuda")
        seven = torch.full((), 7.0, device="cuda")
        with no_sync(mode):
            picked, pairs = y[index], y[index, index % 3]
            y[index[:1]] = seven
        with no_sync(mode), raises_host_sync("index_put"):
            y[index[1:2]] = 7.0
        got = picked.cpu(), pairs.cpu(), y.cpu()
    want = x[rows], x[rows, rows % 3]
    x[rows[:1]] = 7.0  # the number raised before it was written
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]) and torch.equal(got[2], x)


UPLOADS = {
    "to": lambda x: x.to("cuda"),
    "tensor": lambda x: torch.tensor(x.tolist(), device="cuda"),
    "copy_": lambda x: torch.empty(x.shape, device="cuda").copy_(x),
}


@needs_fake_cuda
@pytest.mark.parametrize("upload", sorted(UPLOADS))
def test_a_blocking_copy_to_the_device_is_a_sync_and_a_non_blocking_one_is_not(upload):
    """CUDA's copy kernel synchronises the stream after a blocking host-to-device copy, so the host waits for every
    kernel queued before it: inside a no-sync region that raises, as ``torch.cuda.set_sync_debug_mode("error")`` does
    on a GPU; ``non_blocking=True`` does not wait."""
    x = torch.arange(6, dtype=torch.float32)
    with fake_cuda() as mode:
        with no_sync(mode), raises_host_sync():
            UPLOADS[upload](x)
        with no_sync(mode):
            y = x.to("cuda", non_blocking=True)
            z = torch.empty(6, device="cuda").copy_(x, non_blocking=True)
        assert torch.equal(UPLOADS[upload](x).cpu(), x) and torch.equal(y.cpu(), x) and torch.equal(z.cpu(), x)


@needs_fake_cuda
@emulator_only
def test_a_non_blocking_copy_from_pageable_memory_is_counted_and_to_device_pins():
    """From pageable memory CUDA stages a copy through its own buffer and may wait for the stream: the emulator
    counts such copies (``mode.pageable``, not raised: CUDA's sync debug mode does not flag them either); from a
    pinned tensor, or a view of one, none; ``to_device`` pins first."""
    x = torch.arange(12, dtype=torch.float32).view(3, 4)
    with fake_cuda() as mode:
        with no_sync(mode):
            y = x.to("cuda", non_blocking=True)
            torch.empty(3, 4, device="cuda").copy_(x, non_blocking=True)
        assert mode.pageable == ["aten._to_copy.default", "aten.copy_.default"]
        pinned = x.pin_memory()
        assert pinned.is_pinned() and pinned[1:].is_pinned() and not x.is_pinned()
        pinned.to("cuda", non_blocking=True)
        pinned[1:].to("cuda", non_blocking=True)
        z = to_device(x, "cuda")
        assert len(mode.pageable) == 2 and not mode.syncs
        assert torch.equal(y.cpu(), x) and torch.equal(z.cpu(), x)
    assert to_device(x, "cpu") is x  # nothing to pin for the CPU


@needs_fake_cuda
def test_numpy_of_a_cuda_tensor_raises_as_on_a_gpu():
    with fake_cuda(), pytest.raises(TypeError, match="cuda:0 device type tensor to numpy"):
        torch.ones(2, device="cuda").numpy()


@needs_fake_cuda
def test_mismatched_dtypes_raise_and_cuda_autocast_applies():
    with fake_cuda():
        a, b = torch.randn(4, 8, device="cuda", dtype=torch.bfloat16), torch.randn(8, 8, device="cuda")
        with pytest.raises(RuntimeError, match="dtype"):
            a @ b
        with torch.autocast("cuda", dtype=torch.bfloat16):
            assert (b @ b).dtype == torch.bfloat16
            assert (b @ b).softmax(dim=-1).dtype == torch.float32  # autocast's float32 list
        with torch.autocast("cpu", dtype=torch.bfloat16):  # the CPU's autocast leaves cuda tensors alone
            assert (b @ b).dtype == torch.float32


@needs_fake_cuda
@emulator_only
def test_values_and_gradients_are_the_cpus():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.GELU(), torch.nn.Conv2d(4, 2, 1))
    x = torch.randn(2, 3, 6, 5)
    y = net(x)
    (y.softmax(dim=1)[:, 0] * y[:, 1]).sum().backward()
    want = [p.grad.clone() for p in net.parameters()]
    net.zero_grad(set_to_none=True)
    with fake_cuda():
        net = net.to("cuda")
        y_cuda = net(x.to("cuda"))
        (y_cuda.softmax(dim=1)[:, 0] * y_cuda[:, 1]).sum().backward()  # graph_backward
        assert all(p.grad.device.type == "cuda" for p in net.parameters())
        got = [p.grad.cpu() for p in net.parameters()]
        assert torch.equal(y_cuda.detach().cpu(), y.detach())
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


@needs_fake_cuda
def test_graph_backward_equals_the_autograd_engine_on_the_cpu():
    """Broadcasting (reduced to the input's shape), a leaf used twice (summed), a custom Function."""

    class Square(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, unused_scale: float):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return 2 * x * grad, None

    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(3, 4, generator=g, requires_grad=True), torch.randn(4, generator=g, requires_grad=True)
    x = torch.randn(5, 3, generator=g)

    def loss():
        h = x @ w + b
        return (Square.apply(h, 2.0).sum() + (h * w.sum()).mean()).double()

    loss().backward()
    want = (w.grad.clone(), b.grad.clone())
    w.grad = b.grad = None
    graph_backward(loss())
    torch.testing.assert_close((w.grad, b.grad), want, rtol=0, atol=0)


@needs_fake_cuda
@emulator_only
def test_indexing_a_cpu_tensor_with_cuda_indices_raises_as_on_a_gpu():
    """ATen's index and index_put_ take indices on the CPU or on the indexed tensor's device: a CPU tensor indexed
    with cuda indices raises on a GPU (the CPU and meta kernels do not check it), a cuda tensor indexed with CPU
    indices runs."""
    values = torch.arange(10.0).view(2, 5)
    with fake_cuda():
        index = torch.tensor([0, 3], device="cuda")
        ops = (  # index, index_put_, and index_put_ through setitem
            lambda: values[:, index],
            lambda: values.clone().index_put_((index,), torch.tensor(1.0)),
            lambda: values.clone().__setitem__((slice(None), index), 7.0),
        )
        for op in ops:
            with pytest.raises(RuntimeError, match=r"indices should be either on cpu or on the same device as the "
                                                   r"indexed tensor \(cpu\)"):  # fmt: skip
                op()
        on_cuda = values.to("cuda")
        assert torch.equal(on_cuda[:, index.cpu()].cpu(), values[:, [0, 3]])  # CPU indices into a cuda tensor
        assert torch.equal(on_cuda[:, index].cpu(), values[:, [0, 3]])


@needs_fake_cuda
@emulator_only
@pytest.mark.parametrize("where", ["found_inf", "inv_scale", "grads"])
def test_the_amp_non_finite_check_needs_every_tensor_on_cuda(where):
    """``_amp_foreach_non_finite_check_and_unscale_`` (GradScaler's unscale, the training's non-finite guard) raises
    on a GPU when ``found_inf`` or ``inv_scale`` is a CPU tensor, 0-dim or not (AmpKernels.cu), although FakeTensor
    lets a 0-dim CPU tensor meet cuda ones; with every tensor on cuda it gives the CPU kernel's flag."""
    grads = [torch.tensor([1.0, float("inf")]), torch.ones(3)]
    found, inv_scale = torch.zeros(()), torch.ones(())
    with fake_cuda():
        on_cuda = {
            "grads": [g.to("cuda") for g in grads],
            "found_inf": found.to("cuda"),
            "inv_scale": inv_scale.to("cuda"),
        }
        args = {**on_cuda, where: grads if where == "grads" else on_cuda[where].cpu()}
        with pytest.raises(RuntimeError, match="must be a CUDA tensor"):
            torch._amp_foreach_non_finite_check_and_unscale_(args["grads"], args["found_inf"], args["inv_scale"])
        found_cuda = on_cuda["found_inf"]
        torch._amp_foreach_non_finite_check_and_unscale_(on_cuda["grads"], found_cuda, on_cuda["inv_scale"])
        assert found_cuda.cpu().item() == 1.0
        scale, tracker = torch.full((), 4.0, device="cuda"), torch.zeros((), dtype=torch.int32, device="cuda")
        with pytest.raises(RuntimeError, match="found_inf must be a CUDA tensor"):
            torch._amp_update_scale_(scale, tracker, found_cuda.cpu(), 2.0, 0.5, 10)
        torch._amp_update_scale_(scale, tracker, found_cuda, 2.0, 0.5, 10)
        assert scale.cpu().item() == 2.0  # backed off: the flag was set
