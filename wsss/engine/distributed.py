"""A sampler that resumes mid-epoch, for training under ``torchrun`` (process group: :mod:`wsss.utils.distributed`),
and the view of a training dataset that reads its ``(epoch, index)`` keys."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data import Dataset, DistributedSampler


class ResumableSampler(DistributedSampler):
    """``DistributedSampler`` (shuffled, drop-last shards per rank) that can start mid-epoch, its keys ``(epoch,
    index)`` (:class:`EpochItems` reads them).

    ``set_epoch(e, start=k)`` skips this rank's first ``k`` indices of epoch ``e``, so a resumed run draws
    exactly the batches the uninterrupted run would have drawn, without loading the skipped images.
    """

    def __init__(self, dataset: Dataset, num_replicas: int = 1, rank: int = 0, seed: int = 0):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed, drop_last=True)
        self.start = 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        super().set_epoch(epoch)
        self.start = start

    def __iter__(self) -> Iterator[tuple[int, int]]:
        indices = list(super().__iter__())
        return iter([(self.epoch, index) for index in indices[self.start :]])

    def __len__(self) -> int:
        return self.num_samples - self.start


class EpochItems(Dataset):
    """A training dataset (``epoch`` attribute: its augmentation draws per epoch and index) read by the keys of
    :class:`ResumableSampler`: the epoch travels with every index, so loader workers that live across epochs
    (``persistent_workers``) draw each epoch's crops, where a copy of the dataset made for them would keep the epoch it
    was made in."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: tuple[int, int]) -> Any:
        self.dataset.epoch, index = key
        return self.dataset[index]
