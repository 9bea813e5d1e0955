"""Non-blocking calls, futures chained between groups without a driver round trip."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlhfctl.protocol import DataProto
from rlhfctl.single_controller import GroupFuture
from rlhfctl.single_controller.futures import ShardRef


def make_batch(rows: int) -> DataProto:
    return DataProto.from_dict(
        tensors={"x": torch.arange(rows, dtype=torch.float32)},
        non_tensors={"tag": np.array([f"row{i}" for i in range(rows)], dtype=object)},
    )


@pytest.mark.parametrize("backend", ["ray", "local"])
def test_non_blocking_call_returns_a_future_whose_get_gives_the_result(echo_groups, backend):
    group = echo_groups(backend, 2)
    future = group.add_one_later(make_batch(5))
    assert isinstance(future, GroupFuture)
    assert future.get(timeout=60).batch["x"].tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert future.done()


@pytest.mark.parametrize("source_size,target_size", [(2, 2), (3, 3), (2, 3), (3, 1), (1, 2)])
def test_a_future_feeds_another_group_shard_by_shard(echo_groups, source_size, target_size):
    source, target = echo_groups("ray", source_size), echo_groups("ray", target_size)
    out = target.shard_of(source.add_one_later(make_batch(7)), scale=2)
    assert out.batch["x"].tolist() == [2.0 * (i + 1) for i in range(7)]
    assert list(out.non_tensor_batch["tag"]) == [f"row{i}" for i in range(7)]
    shard = -(-7 // target_size)
    assert out.batch["rank"].tolist() == [i // shard for i in range(7)]


def test_chained_future_is_not_fetched_by_the_driver(echo_groups, monkeypatch):
    source, target = echo_groups("ray", 2), echo_groups("ray", 3)
    future = source.add_one_later(make_batch(6))
    original_get = GroupFuture.get
    fetched = []

    def tracking_get(self, timeout=None):
        fetched.append(self.describe)
        return original_get(self, timeout)

    monkeypatch.setattr(GroupFuture, "get", tracking_get)
    out = target.shard_of(future, scale=1)
    assert fetched == ["echo.shard_of"]  # only the target's own result came to the driver
    assert out.batch["x"].tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]


def test_materialize_futures_false_hands_the_worker_the_reference(echo_groups):
    source, target = echo_groups("ray", 2), echo_groups("ray", 2)
    future = source.add_one_later(make_batch(4))
    assert target.argument_type(future) == [ShardRef.__name__, ShardRef.__name__]


def test_future_of_one_to_all_call_is_broadcast_whole(echo_groups):
    source, target = echo_groups("ray", 2), echo_groups("ray", 3)
    future = source.add_one_later(make_batch(3))
    received = target.rank_and_arg(future)
    assert [rank for rank, _, _ in received] == [0, 1, 2]
    assert all(value.batch["x"].tolist() == [1.0, 2.0, 3.0] for _, value, _ in received)


def test_local_future_passes_between_local_groups(echo_groups):
    source, target = echo_groups("local", 2), echo_groups("local", 3)
    out = target.shard_of(source.add_one_later(make_batch(5)), scale=10)
    assert out.batch["x"].tolist() == [10.0 * (i + 1) for i in range(5)]


@pytest.mark.parametrize("backend", ["ray", "local"])
def test_a_worker_writing_into_its_input_is_caught_with_the_input_check(echo_groups, backend):
    """Received tensors are shared views (object store, or the driver's own on the local backend);
    the test suite runs with RLHFCTL_CHECK_INPUTS=1, which turns such a write into a named error."""
    from rlhfctl.single_controller import WorkerMethodError

    group = echo_groups(backend, 2)
    big = DataProto.from_dict(tensors={"x": torch.zeros(40_000)}, non_tensors={"tag": np.zeros(40_000)})
    with pytest.raises(WorkerMethodError) as caught:
        group.write_in_place(echo_groups(backend, 2).add_one_later(big))  # each rank adds 1 in place
    assert caught.value.rank == 0
    assert "InputWrittenError" in caught.value.detail
    assert "write_in_place wrote in place into tensor 'x' of its positional argument 1" in caught.value.detail
    assert big.batch["x"].sum().item() == 0.0  # the driver's batch was never touched


def test_chaining_into_one_to_all_works_when_the_source_group_is_observed(echo_groups):
    from rlhfctl.trace import TraceRecorder

    source, target = echo_groups("ray", 2), echo_groups("ray", 3)
    recorder = TraceRecorder()
    source.observers.append(recorder)
    try:
        received = target.rank_and_arg(source.add_one_later(make_batch(3)))
    finally:
        source.observers.remove(recorder)
    assert all(value.batch["x"].tolist() == [1.0, 2.0, 3.0] for _, value, _ in received)
