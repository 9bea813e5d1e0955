"""Worker classes used by the single-controller tests (importable by Ray's worker processes)."""

from __future__ import annotations

import os

import numpy as np
import torch

from rlhfctl.errors import UserError
from rlhfctl.protocol import DataProto
from rlhfctl.single_controller import Dispatch, Execute, Worker, register


def _rows_times_ten(data):
    if isinstance(data, DataProto):
        out = DataProto.from_dict(
            tensors={"x": data.batch["x"] * 10, "rank": torch.full((len(data),), float(0))},
            non_tensors={"tag": data.non_tensor_batch["tag"]},
        )
        return out
    if isinstance(data, torch.Tensor):
        return data * 10
    return [item * 10 for item in data]


class SampleSettingError(UserError):
    """A user error no table anywhere names: its exit code comes from its family alone."""


class EchoWorker(Worker):
    """Records which rank saw what, so tests can check every dispatch mode."""

    def __init__(self, offset: int = 0):
        super().__init__()
        self.offset = offset
        self.calls = 0

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def rank_and_arg(self, value, keyword=None):
        return (self.rank, value, keyword)

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def times_ten(self, data):
        return _rows_times_ten(data)

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def shard_of(self, data, scale):
        """Each row tagged with the rank that handled it and the broadcast scale."""
        if isinstance(data, DataProto):
            rows = len(data)
            return DataProto.from_dict(
                tensors={"x": data.batch["x"] * scale, "rank": torch.full((rows,), self.rank)},
                non_tensors={"tag": data.non_tensor_batch["tag"]},
            )
        return [(self.rank, item, scale) for item in data]

    @register(dispatch_mode=Dispatch.ALL_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def rank_zero_shard(self, data):
        return (self.rank, list(data))

    @register(dispatch_mode=Dispatch.ONE_TO_ONE)
    def pick(self, value):
        return (self.rank, value)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def only_rank_zero(self, value):
        self.calls += 1
        return (self.rank, value)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def call_count(self):
        return self.calls

    @register(dispatch_mode=Dispatch.ALL_TO_ALL, blocking=False)
    def add_one_later(self, data):
        return DataProto.from_dict(tensors={"x": data.batch["x"] + 1}, non_tensors={"tag": data.non_tensor_batch["tag"]})

    @register(dispatch_mode=Dispatch.ALL_TO_ALL, blocking=False)
    def score_later(self, data):
        """A new column per row, as a reward or reference call returns."""
        return DataProto.from_dict(tensors={"score": data.batch["x"] * 100})

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def x_plus_score(self, data):
        return DataProto.from_dict(tensors={"total": data.batch["x"] + data.batch["score"],
                                            "rank": torch.full((len(data),), self.rank)})

    @register(dispatch_mode=Dispatch.ALL_TO_ALL, materialize_futures=False)
    def argument_type(self, data):
        return [type(data).__name__]

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def repeat_rows(self, data, times):
        return data.repeat(times, interleave=True)

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def write_in_place(self, data):
        data.batch["x"].add_(1)
        return data

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def fail_on(self, rank):
        if self.rank == rank:
            raise ValueError(f"boom on rank {self.rank}")
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def fail_with_user_error_on(self, rank):
        if self.rank == rank:
            raise SampleSettingError(f"echo.offset: not usable on rank {self.rank}")
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def exit_process(self):
        os._exit(1)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def sleep(self, seconds):
        import time

        time.sleep(seconds)
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def environment(self):
        from rlhfctl.single_controller.worker import GROUP_ENV_VARS

        keys = [*GROUP_ENV_VARS, "RLHFCTL_TEST_FLAG"]
        return {key: os.environ.get(key) for key in keys} | {"offset": self.offset, "rank": self.rank}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def all_reduce_rank(self):
        import torch.distributed as dist

        self.init_distributed("gloo", timeout_s=60)
        value = torch.tensor([float(self.rank + 1)])
        dist.all_reduce(value)
        return float(value.item())


class OtherRoleWorker(Worker):
    """A second role, for colocation: same method name as EchoWorker with a different dispatch."""

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def rank_and_arg(self, data):
        return [(self.rank, item) for item in data]

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def pid(self):
        return os.getpid()


def split_by_parity(group, values):
    """Custom dispatch: rank r gets the values whose index % world_size == r."""
    return ([[v for i, v in enumerate(values) if i % group.world_size == r] for r in range(group.world_size)],), {}


def merge_sum(group, outputs):
    """Custom collect: the sum of every rank's result."""
    return sum(outputs)


class CustomModeWorker(Worker):
    @register(dispatch_mode={"dispatch_fn": split_by_parity, "collect_fn": merge_sum})
    def total(self, values):
        return int(np.sum(values)) if values else 0
