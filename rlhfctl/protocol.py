"""DataProto: the one batch type that flows between the driver and the workers.

A DataProto holds three things that share the batch dimension:

- ``batch``: a dict of ``torch.Tensor`` whose first dimension is the batch,
- ``non_tensor_batch``: a dict of ``numpy.ndarray`` (object dtype allowed) of the same length,
- ``meta_info``: a plain dict that is not split (it travels whole to every shard).

Across Ray it pickles its tensors as numpy arrays, which Ray's object store ships as out-of-band
buffers (no torch.save, no pickling of tensor storage), and the receiver's tensors are zero-copy
views of that shared memory: treat received tensors as read-only (``RLHFCTL_CHECK_INPUTS=1`` catches
a worker that writes into them; ``RLHFCTL_ZERO_COPY=0`` makes every receiver copy once instead).
Every DataProto method here returns new objects and never mutates its inputs.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import torch

__all__ = ["DataProto", "plain_value"]


def _as_object_array(values: Sequence[Any]) -> np.ndarray:
    """Build a 1-D object array without numpy trying to broadcast nested sequences."""
    out = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        out[i] = value
    return out


_PRIMITIVES = (bool, int, float, str)


def _to_numpy(value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, (list, tuple)):
        kinds = {type(item) for item in value}
        # Lists of one primitive type become typed arrays; anything mixed or nested stays one object per row.
        if len(kinds) == 1 and kinds.pop() in _PRIMITIVES:
            return np.asarray(value)
        return _as_object_array(value)
    raise TypeError(f"non-tensor values must be numpy arrays or lists, got {type(value).__name__}")


def _tensor_to_numpy(tensor: torch.Tensor) -> tuple[str, np.ndarray]:
    """Return (dtype name, numpy view) for pickling; bfloat16 travels as its raw int16 bits."""
    tensor = tensor.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    tensor = tensor.contiguous()
    if tensor.dtype == torch.bfloat16:
        return "bfloat16", tensor.view(torch.int16).numpy()
    return str(tensor.dtype).removeprefix("torch."), tensor.numpy()


# Arrays read from Ray's object store are views of shared memory that torch cannot protect: an
# in-place write would change what every other reader of the same object sees. By default they stay
# views (zero-copy); rlhfctl's workers never write into their inputs, which the test suite checks
# with RLHFCTL_CHECK_INPUTS=1 (single_controller/input_guard.py). RLHFCTL_ZERO_COPY=0 makes every
# receiver copy once (a memcpy) for worker code that cannot promise that.
ZERO_COPY = os.environ.get("RLHFCTL_ZERO_COPY", "1") != "0"


def _numpy_to_tensor(dtype_name: str, array: np.ndarray) -> torch.Tensor:
    if not array.flags.writeable and not ZERO_COPY:
        array = array.copy()
    with warnings.catch_warnings():
        # Zero-copy views are read-only numpy arrays; torch warns but shares the memory.
        warnings.simplefilter("ignore", UserWarning)
        tensor = torch.from_numpy(array)
    if dtype_name == "bfloat16":
        tensor = tensor.view(torch.bfloat16)
    return tensor


def plain_value(value: Any) -> Any:
    """A column value as plain Python data (NumPy arrays and scalars become lists and Python values, recursively):
    what JSON, a checkpoint or an agent program can take."""
    if isinstance(value, np.ndarray):
        return [plain_value(item) for item in value.tolist()]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        return {str(key): plain_value(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_value(item) for item in value]
    return value


def columns_equal(left: np.ndarray, right: np.ndarray, name: str = "column") -> bool:
    """Whether two non-tensor columns hold equal rows, NaN equal to NaN in the same place.

    Object rows may be numpy arrays, lists, tuples or dicts of those; ``np.array_equal`` alone
    raises on rows that are arrays ("truth value ... ambiguous") and calls NaN unequal to itself.
    A row that contains itself raises ValueError naming the column instead of recursing forever.
    """
    if left is right:
        return True
    if left.shape != right.shape:
        return False
    if left.dtype != object and right.dtype != object:
        nan_aware = left.dtype.kind in "fc" and right.dtype.kind in "fc"
        return bool(np.array_equal(left, right, equal_nan=nan_aware))
    return all(_values_equal(a, b, name, set()) for a, b in zip(left.ravel(), right.ravel()))


def _values_equal(left: Any, right: Any, name: str, open_ids: set[int]) -> bool:
    """Deep equality of two row values; ``open_ids`` holds the containers being compared (cycle guard)."""
    if left is right:
        return True
    if isinstance(left, np.ndarray) or isinstance(right, np.ndarray):
        if not (isinstance(left, np.ndarray) and isinstance(right, np.ndarray)):
            return False
        return _containers_equal(left, right, name, open_ids, lambda: columns_equal(left, right, name))
    if isinstance(left, (list, tuple)) and isinstance(right, (list, tuple)):
        if type(left) is not type(right) or len(left) != len(right):
            return False
        return _containers_equal(left, right, name, open_ids,
                                 lambda: all(_values_equal(a, b, name, open_ids) for a, b in zip(left, right)))
    if isinstance(left, dict) and isinstance(right, dict):
        if left.keys() != right.keys():
            return False
        return _containers_equal(left, right, name, open_ids,
                                 lambda: all(_values_equal(left[k], right[k], name, open_ids) for k in left))
    if isinstance(left, (float, np.floating)) and isinstance(right, (float, np.floating)):
        return bool(left == right or (np.isnan(left) and np.isnan(right)))
    return bool(left == right)


def _containers_equal(left: Any, right: Any, name: str, open_ids: set[int], compare: Callable[[], bool]) -> bool:
    if id(left) in open_ids or id(right) in open_ids:
        raise ValueError(f"non-tensor '{name}' holds a value that contains itself; cannot compare it for union")
    open_ids.update((id(left), id(right)))
    try:
        return compare()
    finally:
        open_ids.discard(id(left))
        open_ids.discard(id(right))


@dataclass
class DataProto:
    """A batch of tensors, numpy columns and metadata that can be split, sent and rejoined."""

    batch: dict[str, torch.Tensor] = field(default_factory=dict)
    non_tensor_batch: dict[str, np.ndarray] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.check_consistency()

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_dict(
        cls,
        tensors: dict[str, torch.Tensor] | None = None,
        non_tensors: dict[str, Any] | None = None,
        meta_info: dict[str, Any] | None = None,
    ) -> "DataProto":
        """Build a DataProto from plain dicts; lists become numpy columns."""
        tensors = dict(tensors or {})
        for key, value in tensors.items():
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"tensor '{key}' must be a torch.Tensor, got {type(value).__name__}")
        non_tensors = {key: _to_numpy(value) for key, value in (non_tensors or {}).items()}
        return cls(batch=tensors, non_tensor_batch=non_tensors, meta_info=dict(meta_info or {}))

    def check_consistency(self) -> None:
        """Raise ValueError naming the keys when columns disagree on the batch size."""
        sizes: dict[str, int] = {}
        for key, tensor in self.batch.items():
            if tensor.dim() == 0:
                raise ValueError(f"tensor '{key}' is a scalar; batch tensors need a batch dimension")
            sizes[key] = tensor.shape[0]
        for key, array in self.non_tensor_batch.items():
            if array.ndim == 0:
                raise ValueError(f"non-tensor '{key}' is a scalar; put scalars in meta_info")
            sizes[key] = array.shape[0]
        if len(set(sizes.values())) > 1:
            listing = ", ".join(f"{key}={size}" for key, size in sizes.items())
            raise ValueError(f"DataProto columns disagree on the batch size: {listing}")

    # ------------------------------------------------------------------ size and access
    def __len__(self) -> int:
        for tensor in self.batch.values():
            return tensor.shape[0]
        for array in self.non_tensor_batch.values():
            return array.shape[0]
        return 0

    def keys(self) -> list[str]:
        """All column names, tensors first."""
        return list(self.batch) + list(self.non_tensor_batch)

    def __getitem__(self, index: int | slice | Sequence[int] | torch.Tensor | np.ndarray) -> "DataProto":
        """Rows by int, slice, index list/array or boolean mask; always a DataProto."""
        if isinstance(index, str):
            raise TypeError(f"use .batch['{index}'] or .non_tensor_batch['{index}'] to read a column")
        if isinstance(index, (np.integer, torch.Tensor, np.ndarray)) and np.ndim(index) == 0:
            index = int(index)
        if isinstance(index, int):
            size = len(self)
            if not -size <= index < size:
                raise IndexError(f"row {index} out of range for a DataProto of {size} rows")
            index = slice(index, index + 1 if index != -1 else None)
        if isinstance(index, slice):
            if index.step is not None and index.step < 0:
                return self[np.arange(len(self))[index]]
            return self._take_slice(index)
        # Copies, so an index array that is a read-only view (from Ray) is safe to hand to torch. A tensor
        # is cloned by torch itself: np.array(tensor) goes through Tensor.__array__, whose missing `copy`
        # keyword numpy 2 deprecates.
        if isinstance(index, torch.Tensor):
            positions = index.detach().cpu().clone()
        else:
            positions = torch.as_tensor(np.array(index))
        if positions.dtype == torch.bool:
            if positions.numel() != len(self):
                raise IndexError(f"boolean mask of length {positions.numel()} for a DataProto of {len(self)} rows")
            positions = positions.nonzero().flatten()
        positions = positions.long()
        numpy_positions = positions.numpy()
        return DataProto(
            batch={key: tensor[positions] for key, tensor in self.batch.items()},
            non_tensor_batch={key: array[numpy_positions] for key, array in self.non_tensor_batch.items()},
            meta_info=dict(self.meta_info),
        )

    def _take_slice(self, index: slice) -> "DataProto":
        return DataProto(
            batch={key: tensor[index] for key, tensor in self.batch.items()},
            non_tensor_batch={key: array[index] for key, array in self.non_tensor_batch.items()},
            meta_info=dict(self.meta_info),
        )

    # ------------------------------------------------------------------ column operations
    def select(
        self,
        batch_keys: Iterable[str] | None = None,
        non_tensor_batch_keys: Iterable[str] | None = None,
        meta_info_keys: Iterable[str] | None = None,
    ) -> "DataProto":
        """A DataProto with only the named columns (None keeps all of that kind)."""

        def pick(source: dict, keys: Iterable[str] | None, kind: str) -> dict:
            if keys is None:
                return dict(source)
            keys = list(keys)
            missing = [key for key in keys if key not in source]
            if missing:
                raise KeyError(f"{kind} keys {missing} not in DataProto (has {sorted(source)})")
            return {key: source[key] for key in keys}

        return DataProto(
            batch=pick(self.batch, batch_keys, "tensor"),
            non_tensor_batch=pick(self.non_tensor_batch, non_tensor_batch_keys, "non-tensor"),
            meta_info=pick(self.meta_info, meta_info_keys, "meta_info"),
        )

    def pop(
        self,
        batch_keys: Iterable[str] = (),
        non_tensor_batch_keys: Iterable[str] = (),
        meta_info_keys: Iterable[str] = (),
    ) -> "DataProto":
        """Remove the named columns from this DataProto and return them as a new one."""
        popped = self.select(list(batch_keys), list(non_tensor_batch_keys), list(meta_info_keys))
        for key in popped.batch:
            del self.batch[key]
        for key in popped.non_tensor_batch:
            del self.non_tensor_batch[key]
        for key in popped.meta_info:
            del self.meta_info[key]
        return popped

    def union(self, other: "DataProto") -> "DataProto":
        """Columns of both; shared keys must hold equal values."""
        if len(self.batch) + len(self.non_tensor_batch) and len(other.batch) + len(other.non_tensor_batch):
            if len(self) != len(other):
                raise ValueError(f"cannot union DataProtos of {len(self)} and {len(other)} rows")
        batch = dict(self.batch)
        for key, tensor in other.batch.items():
            if key in batch and not torch.equal(batch[key], tensor):
                raise ValueError(f"union: tensor '{key}' differs between the two DataProtos")
            batch[key] = tensor
        non_tensor = dict(self.non_tensor_batch)
        for key, array in other.non_tensor_batch.items():
            if key in non_tensor and not columns_equal(non_tensor[key], array, key):
                raise ValueError(f"union: non-tensor '{key}' differs between the two DataProtos")
            non_tensor[key] = array
        meta = dict(self.meta_info)
        for key, value in other.meta_info.items():
            if key in meta and meta[key] != value:
                raise ValueError(f"union: meta_info '{key}' differs ({meta[key]!r} vs {value!r})")
            meta[key] = value
        return DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)

    # ------------------------------------------------------------------ row operations
    def split(self, split_size: int) -> list["DataProto"]:
        """Consecutive pieces of ``split_size`` rows (the last may be shorter)."""
        if split_size <= 0:
            raise ValueError(f"split_size must be positive, got {split_size}")
        return [self._take_slice(slice(start, start + split_size)) for start in range(0, len(self), split_size)]

    def chunk(self, chunks: int) -> list["DataProto"]:
        """Exactly ``chunks`` contiguous pieces in order; sizes differ by at most one row."""
        if chunks <= 0:
            raise ValueError(f"chunks must be positive, got {chunks}")
        size = len(self)
        base, extra = divmod(size, chunks)
        pieces, start = [], 0
        for i in range(chunks):
            stop = start + base + (1 if i < extra else 0)
            pieces.append(self._take_slice(slice(start, stop)))
            start = stop
        return pieces

    @staticmethod
    def concat(parts: Sequence["DataProto"]) -> "DataProto":
        """Join DataProtos row-wise; meta_info comes from the first part."""
        parts = list(parts)
        if not parts:
            raise ValueError("concat needs at least one DataProto")
        first = parts[0]
        for i, part in enumerate(parts[1:], start=1):
            if set(part.batch) != set(first.batch) or set(part.non_tensor_batch) != set(first.non_tensor_batch):
                raise ValueError(
                    f"concat: part {i} has columns {part.keys()}, part 0 has {first.keys()}"
                )
        batch = {key: torch.cat([part.batch[key] for part in parts]) for key in first.batch}
        non_tensor = {
            key: np.concatenate([part.non_tensor_batch[key] for part in parts]) for key in first.non_tensor_batch
        }
        return DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(first.meta_info))

    def repeat(self, repeat_times: int, interleave: bool = True) -> "DataProto":
        """Each row ``repeat_times`` times: a,a,b,b (interleave) or a,b,a,b."""
        if repeat_times < 1:
            raise ValueError(f"repeat_times must be >= 1, got {repeat_times}")
        size = len(self)
        if interleave:
            positions = np.repeat(np.arange(size), repeat_times)
        else:
            positions = np.tile(np.arange(size), repeat_times)
        return self[positions]

    def pad_to_divisor(self, divisor: int) -> tuple["DataProto", int]:
        """A copy padded by repeating rows from the start so len is a multiple of divisor; returns (padded, pad)."""
        if divisor <= 0:
            raise ValueError(f"divisor must be positive, got {divisor}")
        size = len(self)
        if size == 0:
            raise ValueError("cannot pad an empty DataProto")
        pad = (-size) % divisor
        if pad == 0:
            return self._take_slice(slice(None)), 0
        positions = np.concatenate([np.arange(size), np.arange(pad) % size])
        return self[positions], pad

    def unpad(self, pad: int) -> "DataProto":
        """Drop the last ``pad`` rows added by pad_to_divisor."""
        return self._take_slice(slice(0, len(self) - pad))

    # ------------------------------------------------------------------ misc
    def to(self, device: str | torch.device) -> "DataProto":
        """A DataProto whose tensors live on ``device``."""
        return DataProto(
            batch={key: tensor.to(device) for key, tensor in self.batch.items()},
            non_tensor_batch=dict(self.non_tensor_batch),
            meta_info=dict(self.meta_info),
        )

    def nbytes(self) -> int:
        """Bytes held by the tensor and numeric numpy columns (object columns count as 0)."""
        total = sum(tensor.element_size() * tensor.numel() for tensor in self.batch.values())
        total += sum(array.nbytes for array in self.non_tensor_batch.values() if array.dtype != object)
        return total

    def equals(self, other: "DataProto") -> bool:
        """True when both hold the same columns with equal values and equal meta_info."""
        if set(self.batch) != set(other.batch) or set(self.non_tensor_batch) != set(other.non_tensor_batch):
            return False
        if any(not torch.equal(self.batch[k], other.batch[k]) for k in self.batch):
            return False
        if any(not columns_equal(self.non_tensor_batch[k], other.non_tensor_batch[k], k) for k in self.non_tensor_batch):
            return False
        return self.meta_info == other.meta_info

    def __repr__(self) -> str:
        tensors = ", ".join(f"{k}: {tuple(v.shape)} {str(v.dtype).removeprefix('torch.')}" for k, v in self.batch.items())
        others = ", ".join(f"{k}: {v.dtype}" for k, v in self.non_tensor_batch.items())
        return f"DataProto(len={len(self)}, batch={{{tensors}}}, non_tensor_batch={{{others}}}, meta_info={sorted(self.meta_info)})"

    # Tensors cross process boundaries as numpy arrays so Ray ships them as zero-copy buffers.
    def __getstate__(self) -> dict[str, Any]:
        return {
            "batch": {key: _tensor_to_numpy(tensor) for key, tensor in self.batch.items()},
            "non_tensor_batch": self.non_tensor_batch,
            "meta_info": self.meta_info,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.batch = {key: _numpy_to_tensor(dtype, array) for key, (dtype, array) in state["batch"].items()}
        self.non_tensor_batch = state["non_tensor_batch"]
        self.meta_info = state["meta_info"]
