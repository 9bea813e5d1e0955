"""union_pending: a batch joined with columns still being computed, joined on the ranks that need it."""

from __future__ import annotations

import pytest
import torch

from rlhfctl.protocol import DataProto
from rlhfctl.single_controller import GroupFuture, WorkerMethodError, union_pending
from tests.single_controller.test_futures import make_batch


def _rollout_and_scores(group, rows: int = 4):
    """Like a training step: a rollout with 2 samples per prompt, and a score call fed its future."""
    rollout = group.submit("repeat_rows", make_batch(rows), 2)
    scores = group.score_later(rollout)
    return rollout, scores


def _track_driver_fetches(monkeypatch) -> list[str]:
    fetched: list[str] = []
    original_get = GroupFuture.get

    def tracking_get(self, timeout=None):
        fetched.append(self.describe)
        return original_get(self, timeout)

    monkeypatch.setattr(GroupFuture, "get", tracking_get)
    return fetched


def test_pending_columns_join_on_the_ranks_without_passing_through_the_driver(echo_groups, monkeypatch):
    group = echo_groups("ray", 2)
    rollout, scores = _rollout_and_scores(group)
    batch = rollout.get()
    fetched = _track_driver_fetches(monkeypatch)
    out = group.x_plus_score(union_pending(batch, scores))
    x = batch.batch["x"]
    assert out.batch["total"].tolist() == (x + 100 * x).tolist()
    assert out.batch["rank"].tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert fetched == ["echo.x_plus_score"]  # the scores went from rank to rank, not to the driver
    assert group.argument_type(union_pending(batch, group.score_later(rollout))) == ["ShardUnion", "ShardUnion"]


def test_pending_columns_are_joined_on_the_driver_when_the_world_sizes_differ(echo_groups, monkeypatch):
    source, target = echo_groups("ray", 2), echo_groups("ray", 3)
    rollout, scores = _rollout_and_scores(source, rows=6)
    batch = rollout.get()
    fetched = _track_driver_fetches(monkeypatch)
    out = target.x_plus_score(union_pending(batch, scores))
    x = batch.batch["x"]
    assert out.batch["total"].tolist() == (x + 100 * x).tolist()
    assert out.batch["rank"].tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]
    assert fetched[0] == "echo.score_later"


def test_pending_union_on_the_local_backend_joins_on_the_driver(echo_groups):
    group = echo_groups("local", 2)
    rollout, scores = _rollout_and_scores(group)
    batch = rollout.get()
    out = group.x_plus_score(union_pending(batch, scores))
    assert out.batch["total"].tolist() == (batch.batch["x"] * 101).tolist()


def test_union_pending_without_futures_is_the_batch_itself():
    batch = make_batch(3)
    assert union_pending(batch) is batch


def test_rows_that_do_not_line_up_fail_on_the_rank_naming_the_future(echo_groups):
    group = echo_groups("ray", 2)
    scores = group.score_later(make_batch(4))  # 4 rows, 2 per rank
    doubled = DataProto.from_dict(tensors={"x": torch.arange(8, dtype=torch.float32)})
    with pytest.raises(WorkerMethodError, match=r"echo.score_later returned 2 rows where 4 were expected"):
        group.x_plus_score(union_pending(doubled, scores))
