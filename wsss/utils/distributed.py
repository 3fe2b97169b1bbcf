"""Process-group set-up for ``torchrun`` (single process when launched plainly) and the collectives every tool
uses: training, sharded inference and evaluation."""

from __future__ import annotations

import heapq
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass
class DistInfo:
    """Where this process stands."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_distributed(device: str | None = None) -> DistInfo:
    """Join the process group ``torchrun`` describes in the environment, else run as one process.

    Args:
        device: ``cuda`` or ``cpu``; default: CUDA when available. Under torchrun each rank takes
            ``cuda:LOCAL_RANK`` and NCCL, or gloo on CPU.
    """
    use_cuda = torch.cuda.is_available() if device is None else device.startswith("cuda")
    if use_cuda and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for but CUDA is not available; use --device cpu")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device(f"cuda:{local}") if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(dev)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    return DistInfo(rank=rank, world_size=world, local_rank=local, device=dev)


def all_reduce_mean(x: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over ranks (``x`` itself when not distributed)."""
    if dist.is_available() and dist.is_initialized():
        x = x.clone()
        dist.all_reduce(x)
        x /= dist.get_world_size()
    return x


def all_gather_objects(obj: Any) -> list[Any]:
    """``obj`` of every rank, in rank order (``[obj]`` when not distributed). Every rank must call it."""
    if dist.is_available() and dist.is_initialized():
        out: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(out, obj)
        return out
    return [obj]


def raise_on_every_rank(error: str | None) -> None:
    """Raise ``ValueError`` on every rank when any rank passes an ``error`` (the first in rank order), so that no
    rank is left waiting in a collective for one that stopped. Every rank must call it (a no-op in one process
    without an error)."""
    errors = [e for e in all_gather_objects(error) if e is not None]
    if errors:
        raise ValueError(errors[0])


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def check_launcher(launcher: str | None, command: str = "tools/train.py CONFIG") -> None:
    """Refuse a ``--launcher`` (mmseg's flag) that contradicts how the process was started.

    Args:
        launcher: ``pytorch`` (torchrun's environment must be set), ``none`` (must be a single process), or None
            (whatever the environment says).
        command: The tool and its arguments, for the torchrun line of the error.
    """
    world = os.environ.get("WORLD_SIZE")
    if launcher == "pytorch" and world is None:
        raise RuntimeError(
            "--launcher pytorch needs the environment torchrun sets (WORLD_SIZE, RANK, LOCAL_RANK): start with "
            f"`torchrun --nproc-per-node N {command} --launcher pytorch`"
        )
    if launcher == "none" and int(world or "1") > 1:
        raise RuntimeError(f"--launcher none, but torchrun started {world} processes: use --launcher pytorch")


def rank_and_world() -> tuple[int, int]:
    """(rank, world size) of the initialised process group, or (0, 1)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def balanced_shards(weights: Sequence[int], world_size: int) -> list[list[int]]:
    """Split item indices into ``world_size`` shards of about equal total weight (greedy, largest first).

    Deterministic: items are taken by weight, largest first (the lower index first on ties), each going to the
    shard of least weight so far (the lower rank first on ties); every shard is returned in index order. Every
    rank computes the same split from the same weights, with no communication.
    """
    heap = [(0, rank) for rank in range(world_size)]  # (load, rank): the least loaded, then the lowest rank
    shards: list[list[int]] = [[] for _ in range(world_size)]
    for index in sorted(range(len(weights)), key=lambda i: (-weights[i], i)):
        load, rank = heapq.heappop(heap)
        shards[rank].append(index)
        heapq.heappush(heap, (load + weights[index], rank))
    return [sorted(shard) for shard in shards]


def finish_distributed() -> None:
    """Leave the process group (a no-op in one process): every rank calls it before it exits."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
