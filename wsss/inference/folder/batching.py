"""Batching for inference: decoded images grouped by size, and the dataset that decodes them.

Images of different sizes cannot share a batch without padding, and padding changes a ViT's output (the
zeros take part in attention), so a batch holds only images of one size. Decoded images wait in per-size
buckets; a bucket runs when it holds as many images as a batch of their size may (``batch_size``, fewer for large
images: :meth:`SizeBuckets.capacity`), or, when more than ``BUCKET_WINDOW * batch_size`` images or ``BUCKET_WINDOW *
batch_pixels`` of their decoded pixels wait, the bucket holding the oldest one runs (bounded memory whatever the
images' size, every image eventually runs).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.data import Dataset

from wsss.config import InferConfig
from wsss.inference.folder.sources import Source
from wsss.inference.predictor import model_size
from wsss.utils.fileio import read_image

BUCKET_WINDOW = 4
"""At most ``BUCKET_WINDOW * batch_size`` decoded images, and ``BUCKET_WINDOW * batch_pixels`` of their pixels, wait
for a same-size batch."""

__all__ = ["BUCKET_WINDOW", "ImageList", "SizeBuckets", "default_batch_size", "identity"]


def default_batch_size(cfg: InferConfig, device: str | torch.device) -> int:
    """``infer.batch_size`` on a GPU, ``infer.cpu_batch_size`` elsewhere."""
    return cfg.batch_size if torch.device(device).type == "cuda" else cfg.cpu_batch_size


class SizeBuckets:
    """Group items by image size into batches of at most ``batch_size`` images and ``batch_pixels`` pixels (see the
    module docstring).

    Args:
        batch_size: Most images per batch.
        batch_pixels: Most pixels per batch, counted at the size the model sees (``max_size``); None: no limit.
        max_size: Longest side the model sees (:func:`~wsss.inference.predictor.model_size`).
        window: At most ``window * batch_size`` items and ``window * batch_pixels`` of their pixels (at their own
            size) wait; beyond that the oldest bucket is released.
    """

    def __init__(
        self, batch_size: int, batch_pixels: int | None = None, max_size: int = 0, window: int = BUCKET_WINDOW
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch size must be >= 1, got {batch_size}")
        self.batch_size, self.batch_pixels, self.max_size = batch_size, batch_pixels, max_size
        self.max_held = max(1, window * batch_size)
        self.max_held_pixels = None if batch_pixels is None else window * batch_pixels
        self._buckets: dict[tuple[int, ...], list[Any]] = {}
        self._held = self._held_pixels = 0

    def capacity(self, size: tuple[int, ...]) -> int:
        """Images of ``size`` (H, W, ...) per batch: ``min(batch_size, max(1, batch_pixels // (h w)))``, ``h x w`` the
        size the model sees."""
        if self.batch_pixels is None:
            return self.batch_size
        h, w = model_size(size[:2], self.max_size) if self.max_size else size[:2]
        return min(self.batch_size, max(1, self.batch_pixels // (h * w)))

    def add(self, item: Any, size: tuple[int, ...]) -> list[list[Any]]:
        """Add ``item`` of ``size``; return the batches that are ready now (oldest first)."""
        ready = []
        bucket = self._buckets.setdefault(size, [])
        bucket.append(item)
        self._held += 1
        self._held_pixels += size[0] * size[1]
        if len(bucket) == self.capacity(size):
            ready.append(self._pop(size))
        while self._held > self.max_held or (self.max_held_pixels and self._held_pixels > self.max_held_pixels):
            ready.append(self._pop(next(iter(self._buckets))))
        return ready

    def flush(self) -> list[list[Any]]:
        """Every waiting batch, the one holding the oldest item first."""
        return [self._pop(size) for size in list(self._buckets)]

    def _pop(self, size: tuple[int, ...]) -> list[Any]:
        batch = self._buckets.pop(size)
        self._held -= len(batch)
        self._held_pixels -= len(batch) * size[0] * size[1]
        return batch


class ImageList(Dataset):
    """Decodes sources; a corrupt file, or one over ``max_pixels`` (``data.max_image_pixels``; 0: no cap), yields
    ``image=None`` and the reason."""

    def __init__(self, sources: Sequence[Source], max_pixels: int = 0) -> None:
        self.sources, self.max_pixels = sources, max_pixels

    def __len__(self) -> int:
        return len(self.sources)

    def __getitem__(self, index: int) -> dict:
        try:
            return {"index": index, "image": read_image(self.sources[index].path, self.max_pixels), "error": None}
        except ValueError as err:
            return {"index": index, "image": None, "error": str(err).split(": ", 1)[-1]}


def identity(item: dict) -> dict:
    return item
