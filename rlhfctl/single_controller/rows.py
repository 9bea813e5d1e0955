"""Row-wise operations on the batch types a group call can shard (DataProto, tensors, arrays, lists), and
RowLayout: how ALL_TO_ALL lays a batch's rows over the ranks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from rlhfctl.protocol import DataProto

BATCH_TYPES = (DataProto, torch.Tensor, np.ndarray, list)


def is_batch(value: Any) -> bool:
    """True for values ALL_TO_ALL splits along rows (DataProto, tensor with dim >= 1, array, list)."""
    if isinstance(value, torch.Tensor):
        return value.dim() >= 1
    if isinstance(value, np.ndarray):
        return value.ndim >= 1
    return isinstance(value, (DataProto, list))


def num_rows(value: Any) -> int:
    """Rows of a batch value."""
    return len(value)


def take_rows(value: Any, positions: Sequence[int] | np.ndarray) -> Any:
    """The rows at ``positions`` as a new value of the same type; contiguous ranges become slices."""
    positions = np.asarray(positions, dtype=np.int64)
    if positions.size and np.array_equal(positions, np.arange(positions[0], positions[0] + positions.size)):
        window = slice(int(positions[0]), int(positions[0]) + positions.size)
        return value[window]
    if isinstance(value, list):
        return [value[i] for i in positions]
    if isinstance(value, torch.Tensor):
        return value[torch.from_numpy(positions)]
    return value[positions]


def concat_rows(values: Sequence[Any]) -> Any:
    """Join batch values of one type row-wise."""
    first = values[0]
    if isinstance(first, DataProto):
        return DataProto.concat(values)
    if isinstance(first, torch.Tensor):
        return torch.cat(list(values))
    if isinstance(first, np.ndarray):
        return np.concatenate(list(values))
    if isinstance(first, list):
        return [item for value in values for item in value]
    raise TypeError(f"cannot concatenate values of type {type(first).__name__}")


def same_batch_type(values: Sequence[Any]) -> bool:
    """True when every value is a batch and they all share one type (so they can be concatenated)."""
    if not values or not all(is_batch(value) for value in values):
        return False
    first_type = type(values[0])
    return all(type(value) is first_type for value in values)


@dataclass(frozen=True)
class RowLayout:
    """How ALL_TO_ALL laid ``num_rows`` rows over ``world_size`` ranks, padding the end to equal shards."""

    num_rows: int
    world_size: int

    @property
    def pad(self) -> int:
        """Rows repeated at the end so every rank gets the same number."""
        if self.num_rows < self.world_size:
            return self.world_size - self.num_rows
        return (-self.num_rows) % self.world_size

    @property
    def shard_size(self) -> int:
        return (self.num_rows + self.pad) // self.world_size

    def positions(self, rank: int) -> np.ndarray:
        """Source row of each row in ``rank``'s shard (padding repeats rows from the start)."""
        start = rank * self.shard_size
        padded = np.arange(start, start + self.shard_size, dtype=np.int64)
        return np.where(padded < self.num_rows, padded, (padded - self.num_rows) % max(self.num_rows, 1))
