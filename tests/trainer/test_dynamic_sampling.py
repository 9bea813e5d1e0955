"""Dynamic sampling fills a step with groups that carry signal, draws more batches as needed, and pads prompts to join them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlhfctl.protocol import DataProto
from rlhfctl.tasks.reward_fn import named_score_column
from rlhfctl.rollout.dynamic_sampling import FilteredRollout, FilterGroupsExhausted, Generation, GroupFilterSettings

PAD = 0
RESPONSE = 3


class Ready:
    def __init__(self, value):
        self.value = value

    def get(self):
        return self.value


def generation(prompt_width: int, group_scores: list[list[float]], first_uid: int) -> Generation:
    """A generated, rewarded batch: one group per prompt, each sample's score as given."""
    groups = len(group_scores)
    n = len(group_scores[0])
    uids = np.array([f"u{first_uid + g}" for g in range(groups)], dtype=object)
    prompt_ids = torch.arange(1, groups * prompt_width + 1).reshape(groups, prompt_width)
    prompts = DataProto.from_dict(
        tensors={"input_ids": prompt_ids, "attention_mask": torch.ones_like(prompt_ids)}, non_tensors={"uid": uids})
    rows = groups * n
    responses = torch.full((rows, RESPONSE), 7)
    mask = torch.ones(rows, prompt_width + RESPONSE, dtype=torch.long)
    generated = DataProto.from_dict(
        tensors={"prompts": prompt_ids.repeat_interleave(n, 0), "responses": responses,
                 "input_ids": torch.cat([prompt_ids.repeat_interleave(n, 0), responses], 1), "attention_mask": mask,
                 "position_ids": (mask.cumsum(-1) - 1), "response_mask": torch.ones(rows, RESPONSE, dtype=torch.long)},
        non_tensors={"uid": np.repeat(uids, n)})
    scores = torch.tensor([s for group in group_scores for s in group])
    placed = torch.zeros(rows, RESPONSE)
    placed[:, -1] = scores
    reward = DataProto.from_dict(tensors={"token_level_scores": placed},
                                 non_tensors={"score": scores.double().numpy(), named_score_column("acc"): (scores > 0).double().numpy()})
    return Generation(prompts, Ready(generated), Ready(reward))


def settings(groups=2, batches=3, on_exhausted="train", metric="score"):
    return GroupFilterSettings(metric=metric, max_num_gen_batches=batches, on_exhausted=on_exhausted,
                               groups_per_step=groups, pad_token_id=PAD)


def run(first, more, spec):
    draws = iter(more)
    sent = {}

    def send_scoring(prompts, batch):
        sent["prompts"], sent["batch"] = prompts, batch
        return Ready(batch)

    rollout = FilteredRollout(spec, first, lambda: next(draws), send_scoring)
    batch = rollout.responses()
    return rollout, batch, sent


def test_uniform_groups_are_dropped_and_a_second_batch_fills_the_step():
    first = generation(2, [[1, 1], [0, 1], [0, 0]], first_uid=0)   # only u1 has signal
    second = generation(4, [[0, 0], [1, 0], [0, 1]], first_uid=3)  # u4, u5; the step needs one more
    rollout, batch, sent = run(first, [second], settings(groups=2))
    assert batch.non_tensor_batch["uid"].tolist() == ["u1", "u1", "u4", "u4"]
    assert rollout.prompts.non_tensor_batch["uid"].tolist() == ["u1", "u4"]
    assert sent["batch"] is batch  # the values and the reference are sent for the kept samples only
    assert rollout.metrics() == {"filter/kept_groups": 2.0, "filter/gen_batches": 2.0, "filter/no_signal_fraction": 0.5,
                                 "filter/dropped_fraction": pytest.approx(1 - 2 / 6)}


def test_batches_with_different_prompt_widths_join_left_padded_with_the_responses_in_place():
    first = generation(2, [[0, 1]], first_uid=0)
    second = generation(4, [[1, 0]], first_uid=1)
    _, batch, _ = run(first, [second], settings(groups=2))
    assert batch.batch["prompts"].shape == (4, 4) and batch.batch["input_ids"].shape == (4, 7)
    assert batch.batch["prompts"][0].tolist() == [PAD, PAD, 1, 2]
    assert batch.batch["attention_mask"][0].tolist() == [0, 0, 1, 1, 1, 1, 1]
    assert torch.equal(batch.batch["input_ids"][:, -RESPONSE:], torch.full((4, RESPONSE), 7))
    assert batch.batch["position_ids"][0].tolist() == [0, 0, 0, 1, 2, 3, 4]


def test_the_filter_reads_a_named_score():
    first = generation(2, [[1, 2], [0, 1]], first_uid=0)  # the score differs in both; acc (score > 0) only in u1
    _, by_acc, _ = run(first, [], settings(groups=2, batches=1, metric="acc"))
    assert by_acc.non_tensor_batch["uid"].tolist() == ["u1", "u1"]
    _, by_score, _ = run(first, [], settings(groups=2, batches=1, metric="score"))
    assert by_score.non_tensor_batch["uid"].tolist() == ["u0", "u0", "u1", "u1"]


def test_with_no_group_kept_the_step_trains_on_the_last_batch_as_it_is():
    first = generation(2, [[1, 1]], first_uid=0)
    second = generation(3, [[0, 0], [2, 2]], first_uid=1)
    rollout, batch, _ = run(first, [second], settings(groups=2, batches=2))
    assert batch.non_tensor_batch["uid"].tolist() == ["u1", "u1", "u2", "u2"]
    assert rollout.prompts.non_tensor_batch["uid"].tolist() == ["u1", "u2"]
    assert rollout.metrics()["filter/kept_groups"] == 0.0 and rollout.metrics()["filter/dropped_fraction"] == 1.0


def test_a_metric_the_reward_does_not_return_names_what_it_does():
    from rlhfctl.trainer.sample_metric import MissingRewardMetric

    with pytest.raises(MissingRewardMetric, match=r"algorithm.filter_groups.metric: .* no 'format' score; it gives: score, acc \("):
        run(generation(2, [[0, 1]], first_uid=0), [], settings(metric="format"))


def test_exhausted_batches_train_on_what_was_kept():
    first = generation(2, [[0, 1], [1, 1]], first_uid=0)
    second = generation(2, [[0, 0], [1, 1]], first_uid=2)
    rollout, batch, _ = run(first, [second], settings(groups=2, batches=2))
    assert batch.non_tensor_batch["uid"].tolist() == ["u0", "u0"]
    assert rollout.metrics()["filter/kept_groups"] == 1.0 and rollout.metrics()["filter/gen_batches"] == 2.0


def test_exhausted_batches_stop_the_run_when_the_recipe_says_so():
    first = generation(2, [[1, 1]], first_uid=0)
    with pytest.raises(FilterGroupsExhausted, match=r"after 1 generation batches .* only 0 of 2 groups .*on_exhausted=train"):
        run(first, [], settings(groups=2, batches=1, on_exhausted="error"))


def test_the_kept_groups_are_cut_to_the_step():
    first = generation(2, [[0, 1], [1, 0], [2, 0]], first_uid=0)
    _, batch, _ = run(first, [], settings(groups=2))
    assert batch.non_tensor_batch["uid"].tolist() == ["u0", "u0", "u1", "u1"]
