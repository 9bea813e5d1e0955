"""The partial-rollout buffer: segments continue each unfinished sample from its prefix, tokens keep their versions,
the staleness bound drops whole groups by their oldest token, and a checkpoint's JSON restores it exactly."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from rlhfctl.data.pairs import left_padded
from rlhfctl.protocol import DataProto
from rlhfctl.rollout.partial_buffer import PartialBuffer, training_batch
from tests.workers.recipes import tokenizer as char_tokenizer

EOS = 99


def prompts(rows: list[list[int]]) -> DataProto:
    input_ids, attention_mask = left_padded(rows, 0)
    return DataProto.from_dict({"input_ids": input_ids, "attention_mask": attention_mask},
                               {"uid": [f"p{i}" for i in range(len(rows))], "ground_truth": [str(i) for i in range(len(rows))]})


def generated(rows: list[list[int]], width: int, versions: list[int] | None = None) -> DataProto:
    """A segment's output: each row's new tokens (an EOS ends it), log-prob -0.01 * token."""
    responses = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for index, row in enumerate(rows):
        responses[index, :len(row)] = torch.tensor(row)
        mask[index, :len(row)] = 1
    tensors = {"responses": responses, "response_mask": mask, "rollout_log_probs": -0.01 * responses.float() * mask,
               "ended": torch.tensor([bool(row) and row[-1] == EOS for row in rows])}
    if versions is not None:
        tensors["policy_version"] = torch.tensor(versions)
    return DataProto.from_dict(tensors)


def test_a_segment_continues_each_unfinished_sample_from_its_prompt_and_tokens_so_far():
    buffer = PartialBuffer(n=2, max_new_tokens=6, budget=3, max_staleness=2)
    buffer.add(prompts([[5, 6], [7]]))
    first = buffer.segment()
    assert first.meta_info == {"n": 1, "max_new_tokens": 3, "partial": True}
    assert first.batch["input_ids"].tolist() == [[5, 6], [5, 6], [0, 7], [0, 7]]
    assert first.batch["attention_mask"].tolist() == [[1, 1], [1, 1], [0, 1], [0, 1]]
    buffer.take(generated([[10, 11, 12], [13, EOS], [14, 15, 16], [17, 18, 19]], 3), version=4)
    assert buffer.finished_groups() == 0 and buffer.unfinished() == 3
    second = buffer.segment()  # the finished sample stays out; the others go on from their prefixes
    assert second.batch["input_ids"].tolist() == [[5, 6, 10, 11, 12], [0, 7, 14, 15, 16], [0, 7, 17, 18, 19]]
    assert second.batch["attention_mask"].sum(-1).tolist() == [5, 4, 4]
    # room left is 3 for every row: the budget; a row past max_new_tokens is cut and finished
    buffer.take(generated([[20, EOS], [21, 22, 23], [24, EOS]], 3, versions=[5, 5, 5]), version=99)
    assert buffer.unfinished() == 0
    done = buffer.complete()
    assert [group.uid for group in done] == ["g0", "g1"] and buffer.carried() == 0
    first_group, second_group = done
    assert [sample.tokens for sample in first_group.samples] == [[10, 11, 12, 20, EOS], [13, EOS]]
    assert [sample.versions for sample in first_group.samples] == [[4, 4, 4, 5, 5], [4, 4]]
    assert [sample.segments for sample in second_group.samples] == [2, 2]
    assert second_group.samples[0].tokens == [14, 15, 16, 21, 22, 23]  # filled its 6 tokens: finished without an EOS
    assert second_group.samples[0].log_probs == pytest.approx([-0.14, -0.15, -0.16, -0.21, -0.22, -0.23])


def test_the_training_batch_carries_each_tokens_version_and_each_samples_oldest():
    buffer = PartialBuffer(n=1, max_new_tokens=4, budget=2, max_staleness=3)
    buffer.add(prompts([[5, 6, 7], [8]]))
    buffer.segment()
    buffer.take(generated([[10, 11], [12, EOS]], 2), version=1)
    buffer.segment()
    buffer.take(generated([[13, EOS]], 2), version=2)
    batch = training_batch(buffer.complete(), char_tokenizer(), max_new_tokens=4, temperature=0.7, pad_id=0)
    assert batch.batch["responses"].tolist() == [[10, 11, 13, EOS], [12, EOS, 0, 0]]
    assert batch.batch["token_versions"].tolist() == [[1, 1, 2, 2], [1, 1, 0, 0]]
    assert batch.batch["policy_version"].tolist() == [1, 1] and batch.batch["partial_segments"].tolist() == [2, 1]
    assert batch.batch["prompts"].tolist() == [[5, 6, 7], [0, 0, 8]]
    assert batch.batch["input_ids"].shape == (2, 7) and batch.meta_info["temperature"] == 0.7
    assert batch.non_tensor_batch["uid"].tolist() == ["g0", "g1"]
    assert batch.non_tensor_batch["ground_truth"].tolist() == ["0", "1"]


def test_the_staleness_bound_drops_whole_groups_by_their_oldest_token_and_holds_for_every_token():
    rng = random.Random(0)
    buffer = PartialBuffer(n=2, max_new_tokens=12, budget=3, max_staleness=2)
    dropped_total = 0
    for version in range(12):
        buffer.add(prompts([[5 + version]]))
        dropped = buffer.drop_stale(version)
        dropped_total += dropped
        for group in buffer.groups:  # every token left may train at this version
            assert all(version - v <= 2 for sample in group.samples for v in sample.versions)
        segment = buffer.segment()
        width = segment.meta_info["max_new_tokens"]
        rows = [[rng.randrange(10, 20) for _ in range(rng.randrange(1, width + 1))] for _ in range(len(segment))]
        rows = [row[:-1] + [EOS] if rng.random() < 0.25 else row for row in rows]
        buffer.take(generated(rows, width), version)
        for group in buffer.complete():
            assert all(version - v <= 2 for sample in group.samples for v in sample.versions)
    assert dropped_total > 0 and dropped_total % 2 == 0  # whole groups of n = 2


def test_a_group_at_the_bound_is_kept_and_one_past_it_dropped():
    buffer = PartialBuffer(n=1, max_new_tokens=8, budget=2, max_staleness=1)
    buffer.add(prompts([[5], [6]]))
    buffer.segment()
    buffer.take(generated([[10, 11], [12, 13]], 2), version=3)
    buffer.add(prompts([[7]]))  # nothing generated yet: never dropped
    assert buffer.drop_stale(4) == 0 and len(buffer.groups) == 3
    assert buffer.drop_stale(5) == 2 and [group.uid for group in buffer.groups] == ["g2"]


def test_the_checkpoint_json_restores_the_buffer_exactly():
    buffer = PartialBuffer(n=2, max_new_tokens=6, budget=2, max_staleness=2)
    buffer.add(prompts([[5, 6], [7]]))
    buffer.segment()
    buffer.take(generated([[10, EOS], [11, 12], [13, 14], [15, EOS]], 2), version=0)
    state = json.loads(json.dumps(buffer.state_dict()))
    restored = PartialBuffer(n=2, max_new_tokens=6, budget=2, max_staleness=2)
    restored.load_state_dict(state)
    assert restored.state_dict() == buffer.state_dict() and restored.next_group == 2
    assert torch.equal(restored.segment().batch["input_ids"], buffer.segment().batch["input_ids"])
    out = generated([[20, EOS], [21, EOS]], 2)
    buffer.take(out, 1)
    restored.take(out, 1)
    tok = char_tokenizer()
    ours, theirs = (training_batch(b.complete(), tok, 6, 1.0, 0) for b in (buffer, restored))
    for key in ("responses", "rollout_log_probs", "token_versions", "attention_mask"):
        assert torch.equal(ours.batch[key], theirs.batch[key]), key
    assert np.array_equal(ours.non_tensor_batch["ground_truth"], theirs.non_tensor_batch["ground_truth"])
    restored.add(prompts([[9]]))
    assert restored.groups[-1].uid == "g2"  # a resumed run's new groups never reuse a carried uid


def test_rows_that_do_not_match_the_segment_are_refused():
    buffer = PartialBuffer(n=1, max_new_tokens=4, budget=2, max_staleness=1)
    buffer.add(prompts([[5], [6]]))
    buffer.segment()
    with pytest.raises(RuntimeError, match="1 rows came back for 2 sent"):
        buffer.take(generated([[10]], 2), 0)


def test_a_step_takes_at_most_its_batch_of_finished_groups_the_oldest_first_and_the_rest_wait():
    buffer = PartialBuffer(n=1, max_new_tokens=4, budget=2, max_staleness=3)
    buffer.add(prompts([[5], [6], [7]]))
    buffer.segment()
    buffer.take(generated([[10, EOS], [11, EOS], [12, EOS]], 2), version=0)
    assert [group.uid for group in buffer.complete(2)] == ["g0", "g1"]
    assert buffer.finished_groups() == 1 and buffer.carried() == 1
    assert [group.uid for group in buffer.complete(2)] == ["g2"]


def test_new_prompts_are_wanted_only_while_fewer_than_two_batches_of_groups_are_in_the_making():
    buffer = PartialBuffer(n=1, max_new_tokens=8, budget=2, max_staleness=3)
    assert buffer.wants_prompts(2)
    buffer.add(prompts([[5], [6], [7]]))
    assert buffer.wants_prompts(2)  # 3 of at most 4
    buffer.add(prompts([[8]]))
    assert not buffer.wants_prompts(2) and buffer.wants_prompts(3)


def test_a_snapshot_is_not_changed_by_the_segments_after_it():
    buffer = PartialBuffer(n=1, max_new_tokens=8, budget=2, max_staleness=3)
    buffer.add(prompts([[5]]))
    buffer.segment()
    buffer.take(generated([[10, 11]], 2), version=0)
    snapshot = buffer.state_dict()
    frozen = json.dumps(snapshot)
    buffer.segment()
    buffer.take(generated([[12, 13]], 2), version=1)  # the same sample goes on
    assert json.dumps(snapshot) == frozen and snapshot["groups"][0]["samples"][0]["tokens"] == [10, 11]
    restored = PartialBuffer(n=1, max_new_tokens=8, budget=2, max_staleness=3)
    restored.load_state_dict(snapshot)
    restored.segment()
    restored.take(generated([[20, 21]], 2), version=1)
    assert snapshot["groups"][0]["samples"][0]["tokens"] == [10, 11]  # loading does not share its lists either
