"""A CUDA device on a CPU-only machine: every tensor placed on ``cuda`` is a pair of a FakeTensor on ``cuda:0``
(PyTorch's ``FakeTensorMode``, which checks devices, dtypes and shapes exactly as a CUDA run would) and a CPU
tensor that holds its values (so that results can be compared with a CPU run).

    with fake_cuda(no_sync=True):          # no_sync: a host read of device data raises, as in the training loop
        model = build_model(...).to("cuda")
        loss = model(x.to("cuda")).sum()
        loss.backward()

What raises, and where the rule comes from:
- An op whose tensors are on different devices (a CPU tensor other than a 0-dim one meeting a ``cuda`` one):
  ``FakeTensorDeviceMismatchError`` from the FakeTensor op, the same rule as ``FakeTensorMode`` alone.
- Mismatched dtypes that no autocast covers: the FakeTensor op's meta kernel (and the CPU kernel).
- With ``no_sync=True``, every op that makes the host wait for the device: those FakeTensor cannot answer
  without data (``torch.Tag.data_dependent_output``: ``.item()``, ``bool(t)``, ``torch.equal``;
  ``torch.Tag.dynamic_output_shape``: ``nonzero``, boolean-mask indexing, ``unique``, ``bincount``), and copies
  from ``cuda`` to the CPU (``.cpu()``, ``.tolist()``). Without ``no_sync`` they run and give real values, as
  validation and inference read results back on purpose.
- ``.numpy()`` of a ``cuda`` tensor, as on a GPU.
- The device checks of CUDA kernels that FakeTensor's meta kernels leave out (:data:`CUDA_ONLY_ARGS`, with the
  messages of ATen's ``TORCH_CHECK``): a CPU tensor indexed with ``cuda`` indices (``x[i]``, ``x[i] = v``; ATen's
  ``index`` and ``index_put_``: indices on the CPU or on the indexed tensor's device; a ``cuda`` tensor indexed
  with CPU indices is allowed, as on a GPU), and the AMP kernels (``_amp_foreach_non_finite_check_and_unscale_``,
  ``_amp_update_scale_``) with their ``found_inf``, ``inv_scale`` or scale tensors on the CPU.

Autocast: ``torch.autocast("cuda")`` checks that CUDA is available; inside :func:`fake_cuda` it is told so, and
the ``cuda`` tensors carry the AutocastCUDA dispatch key, so the CUDA autocast op lists apply to them.

Backward: PyTorch's autograd engine needs a CUDA context for ``cuda`` tensors (it asks the driver for the device's
primary context and streams; pytorch/pytorch#92627), which a machine without a GPU cannot give. Inside
:func:`fake_cuda`, ``Tensor.backward`` runs :func:`graph_backward` instead: the same graph and the same derivative
formulas (each ``grad_fn`` node is called in dependency order, gradients are summed, reduced to their input's
shape and checked for device as the engine does), so on CPU tensors it gives the engine's gradients exactly.

- With ``no_sync=True``, a blocking copy from the CPU to ``cuda`` (``.to("cuda")``, ``torch.tensor(..., device="cuda")``
  without ``non_blocking``): CUDA's copy kernel waits for the stream after it (``stream_synchronize``), so the host
  stalls until the device has finished all work queued before it, as on a real GPU under
  ``torch.cuda.set_sync_debug_mode("error")``.

Counted, not raised (:attr:`FakeCudaMode.pageable`): a ``non_blocking`` copy to ``cuda`` from pageable host memory.
CUDA copies asynchronously only from page-locked memory; from pageable memory the driver first stages the data
through a pinned buffer of its own and may synchronise with the stream to do so (the CUDA Runtime API's "API
synchronization behavior"), so the host can stall as for a blocking copy. PyTorch's sync debug mode does not flag it,
hence a count of its own. ``Tensor.pin_memory`` gives a copy that the emulator marks as pinned (a real pin needs a
driver) and ``Tensor.is_pinned`` reads the mark, so code that pins before copying is seen doing so. Counted too
(:attr:`FakeCudaMode.launches`): every op on the device but views and copies to or from the host, about one kernel
launch each on a GPU.

On a machine with a real GPU the emulator steps aside: :func:`fake_cuda` runs the block on the real device, with
``torch.cuda.set_sync_debug_mode("error")`` while ``no_sync`` is set, so every test written for the emulator asserts
its equalities against the real kernels (a stronger test), and a host read raises CUDA's own error. Tests expect that
error through :func:`raises_host_sync`. Tests of the emulator itself are marked :data:`emulator_only`.

What cannot run here: Triton kernels (they need device memory), sparse CSR tensors (the torch dense CRF's splat,
blur and slice products: FakeTensorMode has no sparse layouts, so their constructor reaches the driver; the CRF's
lattice construction runs here, tests/inference/test_crf.py, and the whole CRF in `make gpu-check`), NCCL and
real pinned memory (a driver; marked copies stand in).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from unittest import mock

import pytest
import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from wsss.utils.op_count import is_transfer, is_view
from wsss.utils.tensors import fp32_precision

TORCH_FLOOR = (2, 10)
"""The first torch this harness runs on. Below it ``Tensor.to("cuda")`` initialises the CUDA runtime before the
dispatch mode sees it, so without a driver it raises (measured on 2.4.1, 2.5.1, 2.6.0, 2.8.0 and 2.9.1), and 2.4's
autograd nodes lack the ``_input_metadata`` that :func:`graph_backward` reads. The product itself needs less
(requirements.txt)."""
needs_fake_cuda = pytest.mark.skipif(
    torch.__version__ < TORCH_FLOOR,
    reason=f"the fake-CUDA harness (tests/fake_cuda.py) needs torch >= 2.10; torch {torch.__version__}'s "
    'Tensor.to("cuda") reaches the CUDA driver before the harness sees it',
)
"""Mark every test that uses the harness: below :data:`TORCH_FLOOR` it skips, saying why."""

REAL_GPU = torch.cuda.is_available()
"""A CUDA device is visible: :func:`fake_cuda` runs on it instead of emulating one."""
emulator_only = pytest.mark.skipif(
    REAL_GPU,
    reason="tests the CUDA emulator itself (tests/fake_cuda.py: its error types and messages, its values being the "
    "CPU's bit for bit), which a visible GPU replaces: here the CUDA tests run on the real device",
)
"""Mark a test of the emulator's own behaviour (its error types and messages, values equal to the CPU's)."""
REAL_SYNC_ERROR = "called a synchronizing CUDA operation"
"""CUDA's error under ``torch.cuda.set_sync_debug_mode("error")`` (c10/cuda/CUDAFunctions.cpp)."""

CUDA = torch.device("cuda", 0)
SYNC_TAGS = (torch.Tag.data_dependent_output, torch.Tag.dynamic_output_shape)
INDEXING = (torch.ops.aten.index.Tensor, torch.ops.aten.index_put_.default, torch.ops.aten.index_put.default,
            torch.ops.aten._index_put_impl_.default)  # fmt: skip
CUDA_ONLY_ARGS = {
    torch.ops.aten._amp_foreach_non_finite_check_and_unscale_.default: ("self", "found_inf", "inv_scale"),
    torch.ops.aten._amp_update_scale_.default: ("self", "growth_tracker", "found_inf"),
}
"""CUDA kernels whose named tensor arguments must be ``cuda`` tensors (AmpKernels.cu: "found_inf must be a CUDA
tensor."); FakeTensor's device rule exempts them, as it exempts every 0-dim CPU tensor."""


class HostSyncError(RuntimeError):
    """An op made the host wait for the device inside a ``no_sync`` region."""


class CudaTensor(torch.Tensor):
    """A tensor on the emulated ``cuda:0``: ``fake`` carries the metadata, ``values`` (CPU) the values."""

    values: torch.Tensor
    fake: FakeTensor

    @staticmethod
    def __new__(cls, real: torch.Tensor, fake: FakeTensor) -> CudaTensor:
        out = torch.Tensor._make_wrapper_subclass(
            cls, fake.shape, strides=fake.stride(), storage_offset=fake.storage_offset(), dtype=fake.dtype,
            device=fake.device, layout=fake.layout, requires_grad=False,
        )  # fmt: skip
        out.values, out.fake = real, fake
        return out

    __torch_function__ = torch._C._disabled_torch_function_impl

    def __tensor_flatten__(self):  # a traceable wrapper subclass: Module.to() swaps parameters in place
        return ["values", "fake"], None

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        return CudaTensor(inner["values"], inner["fake"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise RuntimeError(f"{func}: a fake cuda tensor used outside fake_cuda()")

    def __repr__(self) -> str:
        return f"CudaTensor({self.values!r}, device='{self.device}')"

    def tolist(self):  # a copy to the host, as on a GPU (checked as one)
        return self.cpu().tolist()

    def numpy(self, *args, **kwargs):
        raise TypeError(f"can't convert {self.device} device type tensor to numpy. Use Tensor.cpu() first.")


def _is_cuda(device: object) -> bool:
    return device is not None and torch.device(device).type == "cuda"


class FakeCudaMode(TorchDispatchMode):
    """The dispatch mode behind :func:`fake_cuda`."""

    def __init__(self, no_sync: bool) -> None:
        super().__init__()
        self.no_sync = no_sync
        self.fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
        self.syncs: list[str] = []
        """The ops that made the host wait for the device so far (the ``no_sync`` region's errors, counted)."""
        self.pageable: list[str] = []
        """The ``non_blocking`` copies to the device from pageable host memory so far (the module docstring)."""
        self.launches: list[str] = []
        """The ops on the device so far that are not views or copies between the host and the device: about one kernel
        launch each on a GPU (:mod:`wsss.utils.op_count`)."""
        self.pinned: dict[int, torch.Tensor] = {}
        """The storages that ``Tensor.pin_memory`` made inside the block, by address (kept alive, so that no other
        storage takes the address while the block runs)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        flat, _ = tree_flatten((args, kwargs))
        twins = [t for t in flat if isinstance(t, CudaTensor)]
        if not twins and not _is_cuda(kwargs.get("device")):
            return func(*args, **kwargs)  # host work (data loading, numpy glue): plain CPU tensors

        def to_real(x):
            if isinstance(x, CudaTensor):
                return x.values
            return torch.device("cpu") if isinstance(x, torch.device) and x.type == "cuda" else x

        def to_fake(x):
            if isinstance(x, CudaTensor):
                return x.fake
            if isinstance(x, torch.Tensor):  # a host tensor; not through from_tensor, whose weakref memo would
                meta = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")  # stop Module.to's swap
                return FakeTensor(self.fake_mode, meta, x.device)
            return x

        _check_cuda_kernel_devices(func, args, kwargs)
        # aten.index.Tensor carries the tag for its boolean masks (nonzero); with integer indices its output shape is
        # the indices' and nothing waits: FakeTensor raises for a mask below, and that counts
        reads_device = func is not torch.ops.aten.index.Tensor and any(tag in func.tags for tag in SYNC_TAGS)
        real_kwargs = {k: "cpu" if k == "device" and _is_cuda(v) else to_real(v) for k, v in kwargs.items()}
        fake_args, fake_kwargs = tree_map(to_fake, args), tree_map(to_fake, kwargs)
        with self.fake_mode:
            try:
                fake_out = func(*fake_args, **fake_kwargs)
            except (DataDependentOutputException, DynamicOutputShapeException):
                fake_out, reads_device = None, True
        copies_to_host = any(
            isinstance(t, FakeTensor) and t.device.type == "cpu" for t in tree_flatten(fake_out)[0]
        )  # a cuda -> cpu copy: .cpu(), .to("cpu"), .tolist()
        uploads = _blocking_upload(func, args, kwargs)
        if reads_device or copies_to_host or uploads:
            self.syncs.append(str(func))
        if not is_view(func) and not is_transfer(func, args, kwargs):
            self.launches.append(str(func))
        source = _non_blocking_upload(func, args, kwargs)
        if source is not None and not self.is_pinned(source):
            self.pageable.append(str(func))
        if self.no_sync and (reads_device or copies_to_host):
            raise HostSyncError(f"{func} reads device data on the host (a CUDA sync) inside a no-sync region")
        if self.no_sync and uploads:
            raise HostSyncError(
                f"{func}: a blocking copy from the CPU to cuda waits for the device (a CUDA sync) inside a no-sync "
                "region; build the tensor on the device, or copy with non_blocking=True"
            )
        real_out = func(*tree_map(to_real, args), **real_kwargs)
        if fake_out is None:  # data-dependent: describe the real result on the device
            fake_out = tree_map(
                lambda r: FakeTensor(self.fake_mode, r.to("meta"), CUDA) if isinstance(r, torch.Tensor) else r,
                real_out,
            )
        same = {id(t.values): t for t in twins}  # in-place and out= ops return their (cuda) argument

        def pair(real, fake):
            if not isinstance(real, torch.Tensor):
                return real
            if id(real) in same:
                return same[id(real)]
            return CudaTensor(real, fake) if fake.device.type == "cuda" else real

        if isinstance(real_out, (tuple, list)):
            return type(real_out)(pair(r, f) for r, f in zip(real_out, fake_out, strict=True))
        return pair(real_out, fake_out)

    def pin_memory(self, tensor: torch.Tensor, device: object = None) -> torch.Tensor:
        """``Tensor.pin_memory`` here: a copy, marked as pinned."""
        copy = tensor.clone(memory_format=torch.contiguous_format)
        self.pinned[copy.untyped_storage().data_ptr()] = copy
        return copy

    def is_pinned(self, tensor: torch.Tensor, device: object = None) -> bool:
        """``Tensor.is_pinned`` here: a CPU tensor (or a view of one) that :meth:`pin_memory` made."""
        return tensor.device.type == "cpu" and tensor.untyped_storage().data_ptr() in self.pinned


def _non_blocking_upload(func, args, kwargs) -> torch.Tensor | None:
    """The CPU tensor that ``func`` copies to ``cuda`` with ``non_blocking``, or None."""
    if func is torch.ops.aten._to_copy.default:
        src = args[0]
        if not isinstance(src, CudaTensor) and _is_cuda(kwargs.get("device")) and kwargs.get("non_blocking"):
            return src
    if func is torch.ops.aten.copy_.default:
        dst, src = args[0], args[1]
        non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
        if isinstance(dst, CudaTensor) and isinstance(src, torch.Tensor) and not isinstance(src, CudaTensor):
            return src if non_blocking else None
    return None


def _blocking_upload(func, args, kwargs) -> bool:
    """``func`` copies a CPU tensor to ``cuda`` without ``non_blocking``: ``_to_copy`` to a cuda device, ``copy_``
    into a cuda tensor from a CPU one, or an index put of a 0-dim CPU value into a cuda tensor through integer indices
    (``x[index] = 7.0``: Python's setitem makes the number a CPU tensor for a cuda ``x``, and the CUDA index put copies
    it to the device, ``value.to(self.device())`` in TensorAdvancedIndexing.cpp; through one boolean mask it is a
    ``masked_fill_`` instead, which this emulator counts as the mask's read)."""
    if func in INDEXING[1:]:
        self, indices, value = args[0], args[1], args[2]
        integer = all(i is None or i.dtype not in (torch.bool, torch.uint8) for i in indices)
        return isinstance(self, CudaTensor) and not isinstance(value, CudaTensor) and value.dim() == 0 and integer
    if func is torch.ops.aten._to_copy.default:
        return not isinstance(args[0], CudaTensor) and _is_cuda(kwargs.get("device")) and not kwargs.get("non_blocking")
    if func is torch.ops.aten.copy_.default:
        dst, src = args[0], args[1]
        non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
        return isinstance(dst, CudaTensor) and not isinstance(src, CudaTensor) and not non_blocking
    return False


def _check_cuda_kernel_devices(func, args, kwargs) -> None:
    """Raise as the CUDA kernel of ``func`` would on the devices of its arguments (:data:`INDEXING`,
    :data:`CUDA_ONLY_ARGS`); the CPU kernels and FakeTensor's meta kernels do not check these."""
    if func in INDEXING:
        self, indices = args[0], args[1]
        if not isinstance(self, CudaTensor) and any(isinstance(i, CudaTensor) for i in indices if i is not None):
            raise RuntimeError(
                f"indices should be either on cpu or on the same device as the indexed tensor ({self.device})"
            )
    names = CUDA_ONLY_ARGS.get(func)
    if names is not None:
        schema = [a.name for a in func._schema.arguments]
        bound = {**dict(zip(schema, args, strict=False)), **kwargs}  # defaults left out
        for name in names:
            tensors = bound[name] if isinstance(bound[name], (list, tuple)) else [bound[name]]
            if not all(isinstance(t, CudaTensor) for t in tensors):
                raise RuntimeError(f"{func}: {name} must be a CUDA tensor.")


def graph_backward(self: torch.Tensor, gradient: torch.Tensor | None = None, **_: object) -> None:
    """``self.backward()`` without the autograd engine: every ``grad_fn`` node called once, in dependency order.

    Each node gets the sum of the gradients sent to it, reduced to the shape and cast to the dtype of its
    input as the engine's ``validate_outputs`` does, and a gradient on another device than its input raises as
    there. Leaves (``AccumulateGrad``) accumulate into ``.grad``. No hooks run (single-process tests only).
    """
    root = self.grad_fn
    if root is None:
        raise RuntimeError("element 0 of tensors does not require grad and does not have a grad_fn")
    pending: dict[object, int] = {}
    stack, seen = [root], {root}
    while stack:
        node = stack.pop()
        for nxt, _ in node.next_functions:
            if nxt is not None:
                pending[nxt] = pending.get(nxt, 0) + 1
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
    buffers = {root: [torch.ones_like(self) if gradient is None else gradient]}
    ready = [root]
    while ready:
        node = ready.pop()
        grads = [_fit(g, meta) for g, meta in zip(buffers.pop(node), node._input_metadata, strict=True)]
        if type(node).__name__ == "AccumulateGrad":
            var, g = node.variable, grads[0]
            if g is not None:
                var.grad = g.detach() if var.grad is None else var.grad + g
            continue
        outs = node.apply(*grads) if hasattr(node, "apply") else node(*grads)  # custom Functions have apply()
        outs = outs if isinstance(outs, tuple) else (outs,)
        edges = node.next_functions
        if any(g is not None for g in outs[len(edges) :]):
            raise RuntimeError(f"{type(node).__name__}: a gradient for a non-tensor input")
        for (nxt, slot), g in zip(edges, outs[: len(edges)], strict=True):
            if nxt is None:
                continue
            buf = buffers.setdefault(nxt, [None] * len(nxt._input_metadata))
            if g is not None:
                buf[slot] = g if buf[slot] is None else buf[slot] + g
            pending[nxt] -= 1
            if pending[nxt] == 0:
                ready.append(nxt)


def _fit(grad: torch.Tensor | None, meta) -> torch.Tensor | None:
    """A node's incoming gradient as the engine passes it on: on the input's device, at its shape and dtype."""
    if grad is None:
        return None
    if grad.device != meta.device:
        raise RuntimeError(f"invalid gradient: expected device {meta.device} but got {grad.device}")
    if tuple(grad.shape) != tuple(meta.shape):
        grad = grad.sum_to_size(meta.shape)
    return grad.to(meta.dtype) if grad.dtype != meta.dtype and meta.dtype.is_floating_point else grad


def _from_data(constructor):
    """``torch.tensor`` / ``torch.as_tensor`` that build a ``cuda`` tensor as a CPU one moved by ``.to``: their C++
    path copies data to the device with dispatch modes turned off (only FakeTensorMode itself is exempt)."""

    def build(data, *args, device=None, **kwargs):
        if not _is_cuda(device):
            return constructor(data, *args, device=device, **kwargs)
        return constructor(data, *args, **kwargs).to(device)

    return build


class RealCudaMode:
    """What :func:`fake_cuda` yields on a machine with a GPU: ``no_sync`` switches CUDA's sync debug mode."""

    def __init__(self, no_sync: bool) -> None:
        self.no_sync = no_sync

    @property
    def no_sync(self) -> bool:
        return torch.cuda.get_sync_debug_mode() == 2

    @no_sync.setter
    def no_sync(self, value: bool) -> None:
        torch.cuda.set_sync_debug_mode("error" if value else "default")


@contextlib.contextmanager
def fake_cuda(no_sync: bool = False) -> Iterator[FakeCudaMode | RealCudaMode]:
    """Run the block with an emulated ``cuda`` device, or on the real one where a GPU is visible (module docstring).

    Args:
        no_sync: Raise where an op would make the host wait for the device (:func:`raises_host_sync`).
    """
    if REAL_GPU:  # float32 as the CPU computes it: no TF32 in matmuls and convolutions
        mode = RealCudaMode(no_sync)
        try:
            with fp32_precision("ieee"):
                yield mode
        finally:
            mode.no_sync = False
            torch.cuda.synchronize()
        return
    with (
        mock.patch("torch.cuda.amp.common.amp_definitely_not_available", return_value=False),
        mock.patch("torch.cuda.is_bf16_supported", return_value=True),
        mock.patch("torch.cuda._lazy_init"),  # factory functions with device="cuda" initialise CUDA first
        mock.patch.object(torch.Tensor, "backward", graph_backward),
        mock.patch("torch.tensor", _from_data(torch.tensor)),
        mock.patch("torch.as_tensor", _from_data(torch.as_tensor)),
        FakeCudaMode(no_sync) as mode,
        mock.patch.object(torch.Tensor, "pin_memory", lambda self, device=None: mode.pin_memory(self)),
        mock.patch.object(torch.Tensor, "is_pinned", lambda self, device=None: mode.is_pinned(self)),
    ):
        # The first factory call on "cuda" marks the device initialised (through the patched _lazy_init); without
        # it, Tensor.to("cuda") would initialise the real CUDA runtime, which fails without a driver.
        torch.empty(0, device="cuda")
        yield mode


def raises_host_sync(op: str | None = None):
    """``pytest.raises`` for a host read inside a no-sync region: :class:`HostSyncError` naming ``op`` (an ATen op
    name, a regex) on the emulator; CUDA's own error (:data:`REAL_SYNC_ERROR`, which names no op) on a real GPU."""
    if REAL_GPU:
        return pytest.raises(RuntimeError, match=REAL_SYNC_ERROR)
    return pytest.raises(HostSyncError, match=op)


@contextlib.contextmanager
def no_sync(mode: FakeCudaMode | RealCudaMode) -> Iterator[None]:
    """Inside :func:`fake_cuda`, forbid host reads of device data for the block."""
    before, mode.no_sync = mode.no_sync, True
    try:
        yield
    finally:
        mode.no_sync = before
