"""Endless, resumable batching over a dataset, epoch after epoch.

Each epoch's order is a permutation drawn from a generator seeded with ``(seed, epoch)`` alone,
so the order never depends on how many batches were drawn before: a run restored from
``state_dict()`` yields exactly the batches the original run would have yielded next.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Generic, TypeVar

import numpy as np

from rlhfctl.data.errors import DataConfigError

__all__ = ["PromptBatcher"]

Row = TypeVar("Row")


class PromptBatcher(Generic[Row]):
    """Yield lists of rows forever, reshuffling every epoch; checkpoint with ``state_dict()``."""

    def __init__(
        self,
        dataset: Sequence[Row],
        batch_size: int,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = True,
    ) -> None:
        size = len(dataset)
        source = getattr(dataset, "source", "the dataset")
        if batch_size < 1:
            raise DataConfigError(f"batch_size must be at least 1, got {batch_size}")
        if size == 0:
            raise DataConfigError(f"{source} has no prompts to batch")
        if drop_last and batch_size > size:
            raise DataConfigError(
                f"batch_size={batch_size} is larger than the {size} prompts in {source}, so with "
                "drop_last every batch would be dropped; lower the batch size, add prompts, or set drop_last false"
            )
        if seed < 0:
            raise DataConfigError(f"seed must be a non-negative integer, got {seed}")
        self.dataset = dataset
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.epoch = 0
        self.position = 0
        self._order_epoch = -1
        self._order: np.ndarray = np.arange(size)

    @property
    def batches_per_epoch(self) -> int:
        """Batches in one pass over the dataset (the last partial one counts unless drop_last)."""
        size = len(self.dataset)
        return size // self.batch_size if self.drop_last else -(-size // self.batch_size)

    def __len__(self) -> int:
        return self.batches_per_epoch

    def _order_for(self, epoch: int) -> np.ndarray:
        if self._order_epoch != epoch:
            size = len(self.dataset)
            if self.shuffle:
                self._order = np.random.default_rng([self.seed, epoch]).permutation(size)
            else:
                self._order = np.arange(size)
            self._order_epoch = epoch
        return self._order

    def __iter__(self) -> Iterator[list[Row]]:
        return self

    def __next__(self) -> list[Row]:
        size = len(self.dataset)
        remaining = size - self.position
        if remaining <= 0 or (self.drop_last and remaining < self.batch_size):
            self.epoch += 1
            self.position = 0
        order = self._order_for(self.epoch)
        picked = order[self.position : self.position + self.batch_size]
        self.position += len(picked)
        return [self.dataset[int(index)] for index in picked]

    def state_dict(self) -> dict[str, int]:
        """Where the next batch starts: ``{"epoch": ..., "position": ...}``."""
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a ``state_dict()`` taken from a batcher over the same data and settings."""
        missing = {"epoch", "position"} - set(state)
        if missing:
            raise DataConfigError(f"batcher state is missing {sorted(missing)}; expected keys 'epoch' and 'position'")
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position <= len(self.dataset):
            raise DataConfigError(
                f"batcher state epoch={epoch}, position={position} does not fit a dataset of "
                f"{len(self.dataset)} prompts; resume with the same data the checkpoint was made with"
            )
        self.epoch, self.position = epoch, position
