"""The reward function's raw score is logged beside the shaped reward (score/mean, acc/mean) and shown on the console."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlhfctl.cli.reporters import KEY_METRICS, metrics_line
from rlhfctl.protocol import DataProto
from rlhfctl.trainer.metrics import batch_metrics, task_score_metrics
from tests.workers.conftest import local_group
from tests.workers.recipes import tiny_recipe
from tests.workers.test_reward import RESPONSES, scored_batch
from workers import RewardWorker

HERE = "tests.trainer.test_task_score_metrics"


def all_digits(prompts, responses, **columns):
    """0/1: the response is all digits (of RESPONSES = ["12a", "", "7", "xyz9"] only "7")."""
    return [{"score": float(r.isdigit()), "acc": r.isdigit()} for r in responses]


def trained_batch(scored: DataProto) -> DataProto:
    zeros = torch.zeros_like(scored.batch["response_mask"], dtype=torch.float32)
    return scored.union(DataProto.from_dict(tensors={"advantages": zeros, "returns": zeros}))


def test_with_the_overlong_penalty_the_reward_moves_and_the_raw_score_is_the_0_1_mean():
    # max_new_tokens 6, a buffer of 4: "12a" (4 tokens with EOS) loses 0.5 and "xyz9" (5) 0.75.
    recipe = tiny_recipe(rollout={"max_new_tokens": 6},
                         roles={"reward": {"function": f"{HERE}:all_digits", "overlong_buffer": {"enable": True, "len": 4}}})
    with local_group(RewardWorker, recipe, "reward") as group:
        rewards = group.compute_rewards(scored_batch())
    metrics = batch_metrics(trained_batch(scored_batch().union(rewards)))
    assert [r.isdigit() for r in RESPONSES] == [False, False, True, False]
    assert metrics["score/mean"] == 0.25 and metrics["acc/mean"] == 0.25  # the function's 0/1, before shaping
    assert metrics["reward/mean"] == pytest.approx((-0.5 + 0.0 + 1.0 - 0.75) / 4)  # what the advantages start from
    assert metrics["reward/overlong_penalty/mean"] == pytest.approx(-1.25 / 4)
    line = metrics_line(3, 10, metrics)
    assert "reward=-0.0625 score=0.25 acc=0.25 " in line, line


def test_acc_is_logged_only_where_the_reward_returns_it():
    assert task_score_metrics({"score": np.array([1.0, 0.0, 0.0, 0.0])}) == {"score/mean": 0.25}
    assert task_score_metrics({"uid": np.array(["a"])}) == {}
    assert task_score_metrics({"score": np.array([2.0, 0.0]), "reward/acc": np.array([1.0, 0.0])}) == {
        "score/mean": 1.0, "acc/mean": 0.5}


def test_the_console_columns_put_score_and_acc_right_after_reward():
    labels = [label for label, _ in KEY_METRICS]
    assert labels[:3] == ["reward", "score", "acc"]
    assert dict(KEY_METRICS)["score"] == ("score/mean",) and dict(KEY_METRICS)["acc"] == ("acc/mean",)
    assert metrics_line(1, 2, {"reward/mean": 0.5, "time/step": 1.0}) == "step 1/2  reward=0.5 step_s=1"  # absent: skipped
