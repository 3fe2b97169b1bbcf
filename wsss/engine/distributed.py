"""A sampler that resumes mid-epoch, for training under ``torchrun`` (process group: :mod:`wsss.utils.distributed`)."""

from __future__ import annotations

from collections.abc import Iterator

from torch.utils.data import Dataset, DistributedSampler


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
