"""Every dispatch mode x execute mode, world sizes 1-3, on the Ray and local backends."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlhfctl.protocol import DataProto

BACKENDS = ["ray", "local"]
WORLD_SIZES = [1, 2, 3]


def make_batch(rows: int) -> DataProto:
    return DataProto.from_dict(
        tensors={"x": torch.arange(rows, dtype=torch.float32)},
        non_tensors={"tag": np.array([f"row{i}" for i in range(rows)], dtype=object)},
        meta_info={"step": 3},
    )


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_one_to_all_gives_every_rank_the_same_arguments(echo_groups, backend, world_size):
    group = echo_groups(backend, world_size)
    result = group.rank_and_arg({"a": 1}, keyword="k")
    assert result == [(rank, {"a": 1}, "k") for rank in range(world_size)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("rows", [1, 2, 5, 7, 9])
def test_all_to_all_returns_exactly_the_callers_rows_in_order(echo_groups, backend, world_size, rows):
    group = echo_groups(backend, world_size)
    batch = make_batch(rows)
    before = batch.batch["x"].clone()
    out = group.shard_of(batch, scale=2)
    assert len(out) == rows
    assert torch.equal(out.batch["x"], torch.arange(rows, dtype=torch.float32) * 2)
    assert list(out.non_tensor_batch["tag"]) == [f"row{i}" for i in range(rows)]
    # Contiguous shards in rank order: the ranks column never decreases and uses the expected ranks.
    ranks = out.batch["rank"].tolist()
    assert ranks == sorted(ranks)
    shard = -(-max(rows, world_size) // world_size)
    assert ranks == [i // shard for i in range(rows)]
    assert torch.equal(batch.batch["x"], before) and len(batch) == rows  # caller's batch untouched


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_all_to_all_splits_tensors_and_lists_and_broadcasts_scalars(echo_groups, backend, world_size):
    group = echo_groups(backend, world_size)
    tensor = torch.arange(10).reshape(5, 2)
    assert torch.equal(group.times_ten(tensor), tensor * 10)
    items = [1, 2, 3, 4]
    out = group.shard_of(items, scale="s")
    assert [item for _, item, _ in out] == items
    assert all(scale == "s" for _, _, scale in out)


@pytest.mark.parametrize("backend", BACKENDS)
def test_all_to_all_rejects_batches_of_different_lengths(echo_groups, backend):
    group = echo_groups(backend, 2)
    with pytest.raises(ValueError, match="disagree on the number of rows"):
        group.shard_of(make_batch(3), scale=[1, 2])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_all_to_all_strips_padding_when_each_row_becomes_several(echo_groups, backend, world_size):
    group = echo_groups(backend, world_size)
    out = group.repeat_rows(make_batch(4), times=3)
    assert out.batch["x"].tolist() == [float(i) for i in range(4) for _ in range(3)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_rank_zero_runs_on_rank_zeros_share_and_returns_its_result(echo_groups, backend, world_size):
    group = echo_groups(backend, world_size)
    rank, rows = group.rank_zero_shard(list(range(6)))
    assert rank == 0
    assert rows == list(range(6 // world_size))
    before = group.call_count()
    assert group.only_rank_zero("v") == (0, "v")
    after = group.call_count()
    assert after[0] == before[0] + 1 and after[1:] == before[1:]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_one_to_one_gives_rank_i_element_i(echo_groups, backend, world_size):
    group = echo_groups(backend, world_size)
    values = [f"v{i}" for i in range(world_size)]
    assert group.pick(values) == [(i, f"v{i}") for i in range(world_size)]
    with pytest.raises(ValueError, match="one entry per rank"):
        group.pick(values + ["extra"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_workers_see_rank_world_size_and_rendezvous_environment(echo_groups, backend):
    group = echo_groups(backend, 3)
    described = group.environment()
    assert [d["rank"] for d in described] == [0, 1, 2]
    assert all(d["offset"] == 7 for d in described)
    if backend == "ray":
        assert [d["RANK"] for d in described] == ["0", "1", "2"]
        assert {d["WORLD_SIZE"] for d in described} == {"3"}
        assert len({d["MASTER_PORT"] for d in described}) == 1


def test_init_distributed_runs_a_gloo_all_reduce_across_ranks(echo_groups):
    group = echo_groups("ray", 3)
    assert group.all_reduce_rank() == [6.0, 6.0, 6.0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_calling_an_unregistered_method_lists_the_registered_ones(echo_groups, backend):
    group = echo_groups(backend, 1)
    with pytest.raises(AttributeError, match="no registered method 'not_a_method'.*rank_and_arg"):
        group.not_a_method()


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_local_and_ray_backends_give_identical_results(echo_groups, world_size):
    ray_group, local_group = echo_groups("ray", world_size), echo_groups("local", world_size)
    batch = make_batch(7)
    assert ray_group.shard_of(batch, scale=3).equals(local_group.shard_of(batch, scale=3))
    assert ray_group.pick(list(range(world_size))) == local_group.pick(list(range(world_size)))
    assert ray_group.rank_zero_shard([5, 6, 7]) == local_group.rank_zero_shard([5, 6, 7])
