"""The weight channel of ``rollout.placement: separate``: the actor's rank 0 broadcasts its weights to every rollout rank.

The channel is a process group of its own (gloo on the CPU, NCCL on CUDA) with ``1 + rollout ranks``
members: rank 0 is the actor's rank 0, rank ``1 + r`` is rollout rank ``r``. It is built from a TCP store
that the actor's rank 0 serves, so it exists beside any training group the processes already joined.

Weights travel a bucket at a time. A bucket is a flat byte buffer of whole tensors, already cast to
the engine's dtype on the sender; three broadcasts carry it: the length of its header, the header
(names, dtypes, shapes and offsets, as JSON) and the buffer. A header length of 0 ends a sync, so the
receivers need not know the model's layout beforehand, and at most one bucket is alive on each side.
With ``rollout.vllm.tensor_parallel_size`` t > 1 every rank of an engine receives every bucket and its
engine keeps its own shard of each tensor (vLLM's loader slices the full tensors): no rank holds more than
one bucket of whole tensors, nor the whole model.

The channel's collectives wait ``trainer.call_timeout_s`` (:func:`channel_group`), on NCCL too, whose own
default would be 10 minutes: a long first update must not break the sync that queues behind it.
"""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["ChannelGroup", "SyncAddress", "WeightChannel", "bucketed", "channel_group", "nccl_options"]

_ALIGN = 16  # byte offset of every tensor in a bucket: any dtype view of the buffer stays aligned
_STORE_PREFIX = "rlhfctl-weight-sync"


@dataclass(frozen=True)
class SyncAddress:
    """Where the channel's store listens (the actor's rank 0) and how many processes join it."""

    host: str
    port: int
    world_size: int


@dataclass(frozen=True)
class _Entry:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class ChannelGroup:
    """How the channel's process group is made: its backend and how long its collectives wait."""

    backend: str  # "nccl" on CUDA, "gloo" on the CPU
    timeout: datetime.timedelta


def channel_group(device_type: str, timeout_s: float) -> ChannelGroup:
    """The backend for ``device_type`` and the run's call timeout (``trainer.call_timeout_s``) for either backend."""
    return ChannelGroup("nccl" if device_type == "cuda" else "gloo", datetime.timedelta(seconds=float(timeout_s)))


def _process_group(store: Any, rank: int, size: int, spec: ChannelGroup) -> Any:
    """The channel's process group as ``spec`` says: a ProcessGroupNCCL is given the timeout through its options."""
    if spec.backend == "nccl":
        return dist.ProcessGroupNCCL(store, rank, size, nccl_options(spec.timeout))
    return dist.ProcessGroupGloo(store, rank, size, spec.timeout)


def nccl_options(timeout: datetime.timedelta) -> Any:
    """ProcessGroupNCCL's options carrying ``timeout`` (made without one, the group waits NCCL's 10 minutes)."""
    options = dist.ProcessGroupNCCL.Options()
    options._timeout = timeout  # noqa: SLF001 - torch's one way to give a ProcessGroupNCCL its timeout
    return options


def bucketed(weights: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Group (name, tensor) pairs into lists of about ``bucket_bytes`` (at least one tensor each), in order."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in weights:
        bucket.append((name, tensor))
        size += tensor.numel() * tensor.element_size()
        if size >= bucket_bytes:
            yield bucket
            bucket, size = [], 0
    if bucket:
        yield bucket


def _aligned(size: int) -> int:
    return (size + _ALIGN - 1) // _ALIGN * _ALIGN


def _pack(bucket: list[tuple[str, torch.Tensor]], device: torch.device) -> tuple[list[_Entry], torch.Tensor]:
    """One byte buffer holding every tensor of ``bucket`` and the entries that say where each one is."""
    entries, offset = [], 0
    for name, tensor in bucket:
        nbytes = tensor.numel() * tensor.element_size()
        entries.append(_Entry(name, tensor.dtype, tuple(tensor.shape), offset, nbytes))
        offset = _aligned(offset + nbytes)
    buffer = torch.empty(max(offset, 1), dtype=torch.uint8, device=device)
    for (_, tensor), entry in zip(bucket, entries):
        flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
        buffer[entry.offset: entry.offset + entry.nbytes].copy_(flat)
    return entries, buffer


def _encode(entries: list[_Entry]) -> bytes:
    return json.dumps([[e.name, str(e.dtype).removeprefix("torch."), list(e.shape), e.offset, e.nbytes] for e in entries]).encode()


def _decode(header: bytes) -> list[_Entry]:
    return [_Entry(name, getattr(torch, dtype), tuple(shape), offset, nbytes)
            for name, dtype, shape, offset, nbytes in json.loads(header.decode())]


def _unpack(entries: list[_Entry], buffer: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """The tensors of a received bucket: views of ``buffer`` (valid until the next bucket arrives)."""
    return [(entry.name, buffer[entry.offset: entry.offset + entry.nbytes].view(entry.dtype).reshape(entry.shape))
            for entry in entries]


class WeightChannel:
    """One member of the actor -> rollout weight channel: :meth:`send` on channel rank 0, :meth:`receive` elsewhere."""

    def __init__(self, address: SyncAddress, rank: int, device: torch.device, timeout_s: float) -> None:
        spec = channel_group(device.type, timeout_s)
        self.rank, self.device = rank, device
        self._store = dist.TCPStore(address.host, int(address.port), int(address.world_size), is_master=rank == 0,
                                    timeout=spec.timeout)
        store = dist.PrefixStore(_STORE_PREFIX, self._store)
        self._group = _process_group(store, rank, int(address.world_size), spec)

    def _broadcast(self, tensor: torch.Tensor) -> None:
        options = dist.BroadcastOptions()
        options.rootRank = 0
        self._group.broadcast([tensor], options).wait()

    def send(self, buckets: Iterable[list[tuple[str, torch.Tensor]]]) -> int:
        """Broadcast every bucket, then the end mark; returns the bytes of weights sent."""
        sent = 0
        for bucket in buckets:
            entries, buffer = _pack(bucket, self.device)
            header = torch.frombuffer(bytearray(_encode(entries)), dtype=torch.uint8).to(self.device)
            self._broadcast(torch.tensor([header.numel(), buffer.numel()], dtype=torch.int64, device=self.device))
            self._broadcast(header)
            self._broadcast(buffer)
            sent += sum(entry.nbytes for entry in entries)
        self._broadcast(torch.zeros(2, dtype=torch.int64, device=self.device))
        return sent

    def receive(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The (name, tensor) pairs of one sync, a bucket at a time, until the sender's end mark; ``first_arrival``
        is the clock when the first bucket's sizes came (before it, the receivers wait for the sender)."""
        self.first_arrival: float | None = None
        while True:
            sizes = torch.zeros(2, dtype=torch.int64, device=self.device)
            self._broadcast(sizes)
            if self.first_arrival is None:
                self.first_arrival = time.perf_counter()
            header_bytes, buffer_bytes = (int(value) for value in sizes.tolist())
            if header_bytes == 0:
                return
            header = torch.empty(header_bytes, dtype=torch.uint8, device=self.device)
            self._broadcast(header)
            entries = _decode(header.cpu().numpy().tobytes())
            buffer = torch.empty(buffer_bytes, dtype=torch.uint8, device=self.device)
            self._broadcast(buffer)
            yield from _unpack(entries, buffer)
