"""Process-group set-up for ``torchrun`` (single process when launched plainly) and a resumable sampler."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import Dataset, DistributedSampler


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


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


class ResumableSampler(DistributedSampler):
    """``DistributedSampler`` (shuffled, drop-last shards per rank) that can start mid-epoch.

    ``set_epoch(e, start=k)`` skips this rank's first ``k`` indices of epoch ``e``, so a resumed run draws
    exactly the batches the uninterrupted run would have drawn, without loading the skipped images.
    """

    def __init__(self, dataset: Dataset, num_replicas: int = 1, rank: int = 0, seed: int = 0):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed, drop_last=True)
        self.start = 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        super().set_epoch(epoch)
        self.start = start

    def __iter__(self) -> Iterator[int]:
        indices = list(super().__iter__())
        return iter(indices[self.start :])

    def __len__(self) -> int:
        return self.num_samples - self.start


def check_launcher(launcher: str | None) -> None:
    """Refuse a ``--launcher`` (mmseg's flag) that contradicts how the process was started.

    Args:
        launcher: ``pytorch`` (torchrun's environment must be set), ``none`` (must be a single process), or None
            (whatever the environment says).
    """
    world = os.environ.get("WORLD_SIZE")
    if launcher == "pytorch" and world is None:
        raise RuntimeError(
            "--launcher pytorch needs the environment torchrun sets (WORLD_SIZE, RANK, LOCAL_RANK): start with "
            "`torchrun --nproc-per-node N tools/train.py CONFIG --launcher pytorch`"
        )
    if launcher == "none" and int(world or "1") > 1:
        raise RuntimeError(f"--launcher none, but torchrun started {world} processes: use --launcher pytorch")
