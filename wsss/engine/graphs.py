"""The training iteration as CUDA graphs: captured once per kind of iteration, then replayed (``train.cuda_graphs``).

An eager iteration issues about 2,000 kernels (the paper setting; 1,300 for the toy config) from Python, and on an
H100 the host cannot issue them as fast as the GPU runs them: the toy config's iteration took 47 ms eagerly and 6.7 ms
captured by hand as one graph (an H100 probe, docs/benchmarks.md). A replay runs the same kernels on the same memory, so
everything the Python code of an iteration decides must be fixed for the graph, and everything that changes between
iterations must live in device memory the graph reads:

- fixed per graph (the *kind* of an iteration, one graph each): the loss weights, which change once, at
  ``loss.seg_start_iter``, and the batch's ``max_present``, the channel count of the pseudo-label stacks;
- in device memory, written before each replay: the batch (copied into static buffers), the iteration index
  (:meth:`NonFiniteGuard.start`) and the learning rates (each param group's ``lr`` becomes a one-element tensor that
  the schedule fills, with ``capturable`` fused AdamW; float32 on CUDA, whose fused kernel reads a tensor rate as
  float32 where it takes a float as double: a rate 1 float32 ulp (6e-8 relative) from the eager loop's);
- persistent across graphs: the weights, their gradients (zeroed in place inside the graph, never set to None), the
  optimiser state and the guard's flags.

The first ``train.cuda_graph_warmup`` iterations of each kind run eagerly on a side stream (lazy initialisation,
autotuning, the gradients' first allocation), the next is captured and run, and every later one replays. All graphs
share one memory pool, so one graph's outputs may lie where another keeps its intermediates: the loss terms are copied
out after each replay.
Autocast runs without its cast cache (a cached cast made inside a capture would be reused outside it).

The eager :func:`wsss.engine.train.iteration` stays the reference. :class:`ReplayGraphs` is the CPU's twin of CUDA
graphs: tests/engine/test_graphs.py compares the loop through it with the eager one, to the bit, and
bench/op_counts.py counts the host's work of a replayed iteration with it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Protocol

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from wsss.engine.optim import NonFiniteGuard
from wsss.engine.schedule import PolyWarmupScheduler
from wsss.engine.step import TrainingStep, loss_weights
from wsss.models.segmentor import WSSSModel

BATCH_TENSORS = ("image", "label", "box")
"""The batch's tensors, copied into the graphs' static buffers before each replay."""


class Graph(Protocol):
    def replay(self) -> None: ...


class GraphBackend(Protocol):
    """How graphs are made: :class:`CudaGraphs` on a GPU, :class:`ReplayGraphs` on the CPU."""

    def warmup(self, fn: Callable[[], object]) -> object: ...

    def capture(self, fn: Callable[[], object]) -> tuple[Graph, object]: ...


class CudaGraphs:
    """``torch.cuda`` graphs sharing one memory pool, captured in thread-local mode (the data loader's pin-memory
    thread may allocate meanwhile)."""

    def __init__(self) -> None:
        self.pool = torch.cuda.graph_pool_handle()
        self.stream = torch.cuda.Stream()

    def warmup(self, fn: Callable[[], object]) -> object:
        """``fn()`` eagerly on the side stream (CUDA graphs want their warm-up off the default stream)."""
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            out = fn()
        torch.cuda.current_stream().wait_stream(self.stream)
        return out

    def capture(self, fn: Callable[[], object]) -> tuple[Graph, object]:
        """``fn()`` captured into a graph, which is then replayed once (a capture runs nothing)."""
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream, capture_error_mode="thread_local"):
            out = fn()
        graph.replay()
        return graph, out


class ReplayGraphs:
    """CUDA graphs' twin on the CPU: a capture records every ATen operation the code runs (forward, backward, the
    optimiser) while running it, a replay calls the recorded operations again on the same tensors.

    It freezes what a CUDA graph freezes: a value the Python code read while capturing (a learning rate held as a
    float, an iteration index, the channel count of a stack) and the tensors the recording holds (a tensor rebound
    instead of written in place is no longer the one replayed). A replayed output that is a new tensor receives the
    new result by ``copy_``; one that aliases an argument (in-place and ``out=`` operations, views) holds it already.
    A host read of device data during a capture raises, as a CUDA capture fails on a synchronisation. And as graphs
    sharing a memory pool may place one graph's outputs where another keeps its intermediates, a replay fills the
    other graphs' outputs with NaN: what a caller kept of them is gone, as it may be on a GPU.
    """

    def __init__(self) -> None:
        self.graphs: list[_RecordedGraph] = []

    def warmup(self, fn: Callable[[], object]) -> object:
        return fn()

    def capture(self, fn: Callable[[], object]) -> tuple[Graph, object]:
        recorder = _Recorder()
        with recorder:
            out = fn()
        graph = _RecordedGraph(recorder.ops, _tensors(out), self.graphs)
        self.graphs.append(graph)
        return graph, out


def _tensors(tree) -> list[Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, Tensor)]


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if torch.Tag.data_dependent_output in func.tags or torch.Tag.dynamic_output_shape in func.tags:
            raise RuntimeError(f"{func} reads device data on the host: a CUDA graph capture would fail here")
        out = func(*args, **kwargs)
        self.ops.append((func, args, kwargs, out))
        return out


class _RecordedGraph:
    def __init__(self, ops: list[tuple], outputs: list[Tensor], graphs: list[_RecordedGraph]) -> None:
        self.ops, self.outputs, self.graphs = ops, outputs, graphs
        self.replays = 0

    def replay(self) -> None:
        with torch.no_grad():
            for t in (t for other in self.graphs if other is not self for t in other.outputs):
                t.fill_(float("nan") if t.is_floating_point() else -1)
        for func, args, kwargs, out in self.ops:
            with torch._C._AutoDispatchBelowADInplaceOrView():  # the kernels alone, as a graph holds them
                fresh = func(*args, **kwargs)
            inputs = {t.untyped_storage().data_ptr() for t in _tensors((args, kwargs))}
            for old, new in zip(_tensors(out), _tensors(fresh), strict=True):
                if old.untyped_storage().data_ptr() not in inputs:
                    old.copy_(new)
        self.replays += 1


class GraphedIteration:
    """:func:`wsss.engine.train.iteration` (without the loss meter) through graphs of each kind of iteration (module
    docstring). Single process only: under DDP the loop stays eager.

    Args:
        model: The bare model, in train mode.
        step: The training step; its autocast cast cache is turned off here.
        optimizer: Fused AdamW (:func:`wsss.engine.optim.build_optimizer`); its groups' ``lr`` become device tensors
            and ``capturable`` is set.
        scheduler: The schedule, stepped after each iteration (it fills the ``lr`` tensors).
        guard: The non-finite guard of ``optimizer``.
        warmup: Eager iterations of each kind before its capture (``train.cuda_graph_warmup``).
        backend: Makes the graphs (default :class:`CudaGraphs`).
    """

    def __init__(
        self,
        model: WSSSModel,
        step: TrainingStep,
        optimizer: torch.optim.Optimizer,
        scheduler: PolyWarmupScheduler,
        guard: NonFiniteGuard,
        warmup: int,
        backend: GraphBackend | None = None,
    ) -> None:
        if warmup < 1:
            raise ValueError(f"a graph needs at least one eager warm-up iteration, got {warmup}")
        self.model, self.step, self.optimizer, self.scheduler, self.guard = model, step, optimizer, scheduler, guard
        self.warmup = warmup
        self.backend = backend if backend is not None else CudaGraphs()
        step.autocast_cache = False
        device = guard.found.device
        lr_dtype = torch.float32 if device.type == "cuda" else torch.float64  # what each fused kernel reads
        for group in optimizer.param_groups:
            group["capturable"] = True
            group["lr"] = torch.tensor(float(group["lr"]), dtype=lr_dtype, device=device)
        self.rates = [group["lr"] for group in optimizer.param_groups]
        self.graphs: dict[tuple, tuple[Graph, tuple[Tensor, dict[str, Tensor]]]] = {}
        self.seen: Counter[tuple] = Counter()
        self.static: dict[str, Tensor] | None = None

    def kind(self, batch: dict, it: int) -> tuple:
        """What the Python code of iteration ``it`` on ``batch`` decides: the loss weights and ``max_present``."""
        return tuple(loss_weights(it, self.step.cfg.loss).values()), batch["max_present"]

    def __call__(self, batch: dict, it: int) -> tuple[Tensor, dict[str, Tensor]]:
        """Iteration ``it`` on ``batch`` (on the device, with ``max_present``); returns the loss and its terms, copied
        out of the graph's memory (which the next replay of any graph may overwrite: the graphs share a pool)."""
        kind = self.kind(batch, it)
        self.guard.start(it)
        if kind in self.graphs:
            graph, out = self.graphs[kind]
            self._fill(batch)
            graph.replay()
        elif self.seen[kind] < self.warmup:
            self.seen[kind] += 1
            out = self.backend.warmup(lambda: self._body(batch, it))
        else:
            static = self._fill(batch)
            graph, out = self.backend.capture(lambda: self._body({**static, "max_present": kind[1]}, it))
            self.graphs[kind] = graph, out
        self.scheduler.step()
        for group, rate in zip(self.optimizer.param_groups, self.rates, strict=True):
            if group["lr"] is not rate:  # a torch whose schedulers assign floats (recent ones fill tensors in place)
                rate.fill_(group["lr"])
                group["lr"] = rate
        loss, terms = out
        copied = torch.stack([loss.detach(), *(v.detach() for v in terms.values())]).unbind()  # one copy
        return copied[0], dict(zip(terms, copied[1:], strict=True))

    def _fill(self, batch: dict) -> dict[str, Tensor]:
        """Copy the batch into the static buffers (made at the first capture) and return them."""
        if self.static is None:
            self.static = {k: torch.empty_like(batch[k]) for k in BATCH_TENSORS}
        for k in BATCH_TENSORS:
            self.static[k].copy_(batch[k], non_blocking=True)
        return self.static

    def _body(self, batch: dict, it: int) -> tuple[Tensor, dict[str, Tensor]]:
        """What a graph holds: the step, in-place zeroed gradients, backward, the guard, the update."""
        loss, terms = self.step(self.model, self.model, batch, it)
        self.optimizer.zero_grad(set_to_none=False)
        loss.backward()
        self.guard.update(loss)
        self.optimizer.step()
        return loss, terms
