"""RewardWorker: named scores (a mapping per sample or name -> list), function_kwargs, DAPO's overlong penalty."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from rlhfctl.algorithms.overlong import overlong_penalty
from rlhfctl.recipe.errors import RecipeError
from rlhfctl.single_controller import WorkerMethodError
from rlhfctl.tasks.reward_fn import (
    NAMED_SCORE_PREFIX,
    named_score_column,
    named_score_names,
    named_score_problem,
)
from tests.workers.conftest import local_group
from tests.workers.recipes import TINY_MODEL, tiny_recipe
from tests.workers.test_reward import RESPONSES, scored_batch
from workers import RewardWorker
from workers.reward import is_internal_column
from rlhfctl.rewards.functions import (
    RewardFunctionError,
    RewardOutputError,
    call_reward_function,
    reward_call_problem,
)

HERE = "tests.workers.test_reward_named_scores"
CALLS: list[dict[str, Any]] = []
# RESPONSES = ["12a", "", "7", "xyz9"]: len() 3, 0, 1, 4; only "7" is all digits.
SCORES = [3.0, 0.0, 1.0, 4.0]
ACC = [0.0, 0.0, 1.0, 0.0]


# ---------------------------------------------------------------------------------- reward functions under test
def per_sample(prompts, responses, **columns):
    """A mapping per sample: bools count 0/1, strings and None ('pred') are ignored."""
    CALLS.append({"responses": list(responses), "columns": dict(columns)})
    return [{"score": float(len(r)), "acc": r.isdigit(), "format": 0.5, "pred": r[-1:] or None} for r in responses]


def column_form(prompts, responses, **columns):
    return {"score": np.array([float(len(r)) for r in responses]), "acc": [int(r.isdigit()) for r in responses],
            "pred": list(responses)}


def named_unless_told_to_fail(prompts, responses, ground_truth, **columns):
    if "fail" in ground_truth:
        raise RuntimeError("judge unavailable")
    return [{"score": 1.0, "acc": True} for _ in responses]


def with_method(prompts, responses, method, **columns):
    CALLS.append({"method": method, "columns": dict(columns)})
    return [1.0 if method == "flexible" else 0.0] * len(responses)


def length_score(prompts, responses, **columns):
    return [float(len(r)) for r in responses]


def no_score(prompts, responses, **columns):
    return [{"acc": 1.0} for _ in responses]


def acc_missing_at_two(prompts, responses, **columns):
    return [{"score": 1.0} if i == 2 else {"score": 1.0, "acc": 1.0} for i in range(len(responses))]


def bonus_only_at_one(prompts, responses, **columns):
    return [{"score": 1.0, "bonus": 2.0} if i == 1 else {"score": 1.0} for i in range(len(responses))]


def acc_nan_at_three(prompts, responses, **columns):
    return [{"score": 1.0, "acc": math.nan if i == 3 else 1.0} for i in range(len(responses))]


def score_is_text(prompts, responses, **columns):
    return [{"score": "high"} for _ in responses]


def short_acc_column(prompts, responses, **columns):
    return {"score": [1.0] * len(responses), "acc": [1.0] * (len(responses) - 1)}


def columns_without_score(prompts, responses, **columns):
    return {"acc": [1.0] * len(responses)}


def slash_in_name(prompts, responses, **columns):
    return [{"score": 1.0, "a/b": 1.0} for _ in responses]


def empty_name(prompts, responses, **columns):
    return [{"score": 1.0, "": 1.0} for _ in responses]


def float_then_mapping(prompts, responses, **columns):
    return [1.0, *({"score": 1.0} for _ in responses[1:])]


def floats_then_named(prompts, responses, index, **columns):
    """Plain floats for the first chunk, named scores from sample 2 on."""
    return [1.0] * len(responses) if 0 in index else [{"score": 1.0, "acc": 1.0} for _ in responses]


def returns_overlong_penalty(prompts, responses, **columns):
    return [{"score": 1.0, "overlong_penalty": 0.0} for _ in responses]


def reward_recipe(**reward) -> dict:
    return tiny_recipe(roles={"reward": {"function": None, **reward}})


def rewards(function: str, batch=None, **reward):
    with local_group(RewardWorker, reward_recipe(function=f"{HERE}:{function}", **reward), "reward") as group:
        return group.compute_rewards(batch or scored_batch())


# ---------------------------------------------------------------------------------- the column naming rule
def test_named_score_columns_carry_the_prefix_and_come_back_as_names():
    assert NAMED_SCORE_PREFIX == "reward/" and named_score_column("acc") == "reward/acc"
    assert named_score_names(["uid", "reward/acc", "score", "reward/format"]) == ["acc", "format"]
    assert named_score_problem("acc") is None
    assert "'/'" in named_score_problem("a/b") and "non-empty" in named_score_problem("")
    assert "the reward itself" in named_score_problem("score")


def test_named_score_columns_are_internal_not_data():
    assert is_internal_column("reward/acc") and is_internal_column("uid") and not is_internal_column("ground_truth")


# ---------------------------------------------------------------------------------- both return forms
@pytest.mark.parametrize("function", ["per_sample", "column_form"])
def test_named_scores_become_float_columns_beside_the_raw_score(function):
    out = rewards(function)
    columns = out.non_tensor_batch
    assert columns["score"].tolist() == SCORES
    assert columns["reward/acc"].dtype == np.float64 and columns["reward/acc"].tolist() == ACC
    assert "reward/pred" not in columns and "reward/score" not in columns  # strings ignored, score not repeated
    assert named_score_names(columns) == (["acc", "format"] if function == "per_sample" else ["acc"])
    assert out.batch["token_level_scores"].sum(-1).tolist() == SCORES


def test_named_score_columns_are_not_passed_back_to_the_function():
    CALLS.clear()
    batch = scored_batch()
    batch.non_tensor_batch["reward/acc"] = np.zeros(len(RESPONSES))  # e.g. a batch scored once already
    rewards("per_sample", batch)
    assert set(CALLS[-1]["columns"]) == {"ground_truth", "index"}


def test_chunks_join_and_a_zeroed_chunk_scores_zero_for_every_named_score():
    batch = scored_batch(ground_truth=["12", "3", "fail", "9"])
    out = rewards("named_unless_told_to_fail", batch, batch_size=2, on_error="zero")
    assert out.non_tensor_batch["score"].tolist() == [1.0, 1.0, 0.0, 0.0]
    assert out.non_tensor_batch["reward/acc"].tolist() == [1.0, 1.0, 0.0, 0.0]
    assert out.non_tensor_batch["reward_error"].tolist() == [False, False, True, True]


def test_a_failing_first_chunk_takes_the_names_of_the_next():
    batch = scored_batch(ground_truth=["fail", "3", "7", "9"])
    out = rewards("named_unless_told_to_fail", batch, batch_size=2, on_error="zero")
    assert out.non_tensor_batch["reward/acc"].tolist() == [0.0, 0.0, 1.0, 1.0]


def test_a_batch_that_fails_whole_keeps_the_names_of_the_last_call():
    recipe = reward_recipe(function=f"{HERE}:named_unless_told_to_fail", on_error="zero")
    with local_group(RewardWorker, recipe, "reward") as group:
        group.compute_rewards(scored_batch())
        out = group.compute_rewards(scored_batch(ground_truth=["fail"] * 4))
    assert out.non_tensor_batch["reward/acc"].tolist() == [0.0] * 4  # the ranks' batches keep the same columns
    assert out.meta_info["reward/errors"] == 4


# ---------------------------------------------------------------------------------- what breaks the contract
@pytest.mark.parametrize(
    ("function", "message"),
    [
        ("no_score", r"no_score returned a mapping without 'score' for sample 0 \(keys: 'acc'\)"),
        ("acc_missing_at_two", r"acc_missing_at_two returned no number for 'acc' for sample 2 \(sample 0 has one\)"),
        ("bonus_only_at_one", r"bonus_only_at_one returned no number for 'bonus' for sample 0 \(sample 1 has one\)"),
        ("acc_nan_at_three", r"acc_nan_at_three returned a non-finite 'acc' \(nan\) for sample 3"),
        ("score_is_text", r"score_is_text returned a non-number score \('high'\) for sample 0"),
        ("short_acc_column", r"short_acc_column returned 3 values for 'acc' for 4 samples \(samples 0..3\)"),
        ("columns_without_score", r"columns_without_score returned a mapping without 'score' for samples 0..3"),
        ("slash_in_name", r"slash_in_name, sample 0: the named score 'a/b' has a '/'"),
        ("empty_name", r"empty_name, sample 0: a named score needs a non-empty string name, got ''"),
        ("float_then_mapping", r"float_then_mapping returned a float for sample 0 beside mappings"),
    ],
)
def test_bad_named_scores_are_output_errors_naming_function_sample_and_name(function, message):
    with pytest.raises(WorkerMethodError, match=message) as caught:
        rewards(function)
    assert isinstance(caught.value.__cause__, RewardOutputError)


def test_every_chunk_must_carry_the_same_names():
    with pytest.raises(WorkerMethodError, match=r"floats_then_named returned no number for 'acc' for sample 0 "
                                                r"\(sample 2 has one\)") as caught:
        rewards("floats_then_named", batch_size=2)
    assert isinstance(caught.value.__cause__, RewardOutputError)


# ---------------------------------------------------------------------------------- function_kwargs
def test_function_kwargs_go_in_on_every_call():
    CALLS.clear()
    out = rewards("with_method", batch_size=2, function_kwargs={"method": "flexible"})
    assert [call["method"] for call in CALLS] == ["flexible", "flexible"]
    assert "method" not in CALLS[0]["columns"] and out.non_tensor_batch["score"].tolist() == [1.0] * 4


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ground_truth": "x"}, r"roles.reward.function_kwargs 'ground_truth' is also the data column 'ground_truth'"),
        ({"prompts": "x"}, r"roles.reward.function_kwargs 'prompts' is the reward worker's own argument 'prompts'"),
    ],
)
def test_a_kwarg_that_is_also_a_data_column_is_an_error(kwargs, message):
    with pytest.raises(WorkerMethodError, match=message) as caught:
        rewards("length_score", function_kwargs=kwargs)
    assert isinstance(caught.value.__cause__, RewardFunctionError)


def test_reward_call_problem_counts_the_kwargs_the_recipe_gives():
    assert "it needs 'method'" in reward_call_problem(with_method, ["ground_truth"])  # the old call still works
    assert reward_call_problem(with_method, ["ground_truth"], kwargs={"method": "strict"}) is None

    def strict(prompts, responses, ground_truth):
        return [0.0] * len(responses)

    problem = reward_call_problem(strict, ["ground_truth"], kwargs={"method": "strict"})
    assert "does not take 'method'" in problem and "**function_kwargs" in problem
    assert "roles.reward.function_kwargs: method" in problem
    clash = reward_call_problem(strict, ["ground_truth"], kwargs={"ground_truth": "1"})
    assert "'ground_truth' is also the data column 'ground_truth'" in clash


def test_a_kwarg_the_function_does_not_take_fails_the_call_with_the_signature_problem():
    def strict(prompts, responses):
        return [0.0] * len(responses)

    with pytest.raises(RewardFunctionError, match=r"roles.reward.function: strict\(prompts, responses\).*does not take 'method'"):
        call_reward_function(strict, "strict", ["p"], ["r"], {}, kwargs={"method": "x"}, on_error="zero")


# ---------------------------------------------------------------------------------- DAPO's overlong buffer
def overlong_recipe(**reward) -> dict:
    # max_new_tokens 6 and a buffer of 4: the expected length is 2, a 6-token response loses penalty_factor.
    return tiny_recipe(rollout={"max_new_tokens": 6}, roles={"reward": {"function": None, **reward}})


def test_the_overlong_penalty_joins_the_reward_but_not_the_raw_score():
    recipe = overlong_recipe(function=f"{HERE}:length_score", overlong_buffer={"enable": True, "len": 4})
    with local_group(RewardWorker, recipe, "reward") as group:
        out = group.compute_rewards(scored_batch())
    # Valid response tokens, EOS included (as verl's valid_response_length): "12a"+eos 4, "" 0, "7"+eos 2, "xyz9"+eos 5.
    lengths = torch.tensor([4, 0, 2, 5])
    batch = scored_batch()
    assert torch.equal(batch.batch["attention_mask"][:, -5:].sum(-1), lengths)
    assert torch.equal(batch.batch["response_mask"].sum(-1), lengths)
    penalty = [-0.5, 0.0, 0.0, -0.75]  # min(-(L - 2) / 4, 0)
    assert overlong_penalty(lengths, 6, 4, 1.0).tolist() == penalty
    assert out.non_tensor_batch["reward/overlong_penalty"].tolist() == penalty
    assert out.non_tensor_batch["score"].tolist() == SCORES  # the function's own score
    expected = torch.zeros(4, 5)
    expected[0, 3], expected[1, 0], expected[2, 1], expected[3, 4] = 2.5, 0.0, 1.0, 3.25
    assert torch.equal(out.batch["token_level_scores"], expected)


def test_the_penalty_factor_scales_and_named_scores_stay():
    recipe = overlong_recipe(function=f"{HERE}:per_sample",
                             overlong_buffer={"enable": True, "len": 4, "penalty_factor": 2.0})
    with local_group(RewardWorker, recipe, "reward") as group:
        out = group.compute_rewards(scored_batch())
    assert out.non_tensor_batch["reward/overlong_penalty"].tolist() == [-1.0, 0.0, 0.0, -1.5]
    assert named_score_names(out.non_tensor_batch) == ["acc", "format", "overlong_penalty"]
    assert out.batch["token_level_scores"].sum(-1).tolist() == [2.0, 0.0, 1.0, 2.5]


def test_a_disabled_buffer_adds_nothing():
    out = rewards("length_score", overlong_buffer={"enable": False, "len": 0})
    assert "reward/overlong_penalty" not in out.non_tensor_batch
    assert out.batch["token_level_scores"].sum(-1).tolist() == SCORES


def test_a_function_may_not_return_the_penalty_column_itself():
    recipe = overlong_recipe(function=f"{HERE}:returns_overlong_penalty", overlong_buffer={"enable": True, "len": 4})
    match = r"named score 'overlong_penalty'.*overlong_buffer writes"
    with local_group(RewardWorker, recipe, "reward") as group, pytest.raises(WorkerMethodError, match=match):
        group.compute_rewards(scored_batch())


def test_the_reward_model_score_gets_the_penalty_too():
    recipe = overlong_recipe(model=dict(TINY_MODEL), overlong_buffer={"enable": True, "len": 4})
    with local_group(RewardWorker, recipe, "reward") as group:
        out = group.compute_rewards(scored_batch())
    score = torch.tensor(out.non_tensor_batch["score"], dtype=torch.float32)
    penalty = torch.tensor([-0.5, 0.0, 0.0, -0.75])
    assert out.non_tensor_batch["reward/overlong_penalty"].tolist() == penalty.tolist()
    assert torch.allclose(out.batch["token_level_scores"].sum(-1), score + penalty, atol=1e-6)


@pytest.mark.parametrize(
    ("buffer", "message"),
    [
        ({"enable": True, "len": 0}, r"roles.reward.overlong_buffer.len must be > 0 .*got 0"),
        ({"enable": True, "len": 7}, r"roles.reward.overlong_buffer.len \(7\) must be <= rollout.max_new_tokens \(6\)"),
    ],
)
def test_an_unusable_buffer_stops_the_worker_at_start(buffer, message):
    with pytest.raises(RecipeError, match=message) as caught:
        RewardWorker(overlong_recipe(function=f"{HERE}:length_score", overlong_buffer=buffer), "reward")
    assert caught.value.key_path == "roles.reward.overlong_buffer.len"
