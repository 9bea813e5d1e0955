"""Demonstration and preference datasets: record formats, length limits, errors, and collation layouts."""

from __future__ import annotations

import pytest
import torch

from rlhfctl.data.errors import DataFileError
from rlhfctl.data.pairs import (
    DemonstrationDataset,
    PreferenceDataset,
    collate_demonstrations,
    collate_policy_pairs,
    collate_reward_pairs,
    fit_example,
)
from rlhfctl.models.loading import load_tokenizer
from rlhfctl.tasks import get_task

TOKENIZER = load_tokenizer({"config": {"model_type": "qwen2"}})
EOS, PAD = TOKENIZER.eos_token_id, TOKENIZER.pad_token_id


def ids(text: str) -> tuple[int, ...]:
    return tuple(TOKENIZER(text, add_special_tokens=False)["input_ids"])


def test_prompt_response_records_end_with_eos_and_keep_their_split():
    data = DemonstrationDataset([{"prompt": "q:", "response": " ab"}], TOKENIZER)
    row = data[0]
    assert row.prompt_ids == ids("q:") and row.response_ids == (*ids(" ab"), EOS)


def test_chat_records_render_all_but_the_last_message_as_the_prompt():
    chat = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    row = DemonstrationDataset([chat], TOKENIZER)[0]
    assert row.prompt_ids == ids("user: hi\nassistant: ") and row.response_ids == (*ids("yo"), EOS)


@pytest.mark.parametrize("record, words", [
    ({"prompt": "q"}, "record 1: no 'response' column"),
    ({"prompt": "q", "response": ""}, "record 1: the response ('response') is empty"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}, "must be the assistant's"),
    ({"text": "q"}, "no 'prompt' column"),
])
def test_bad_demonstrations_name_the_source_record_and_column(record, words):
    with pytest.raises(DataFileError) as caught:
        DemonstrationDataset([record], TOKENIZER, source="demos.jsonl")
    assert str(caught.value).startswith("demos.jsonl: record 1") and words in str(caught.value)


def test_overlong_policies():
    record = {"prompt": "p" * 10, "response": "r" * 10}
    with pytest.raises(DataFileError, match="21 tokens, over data.max_length=8"):
        DemonstrationDataset([record], TOKENIZER, max_length=8)
    truncated = DemonstrationDataset([record], TOKENIZER, max_length=8, overlong="truncate")
    assert len(truncated[0]) == 8 and truncated.truncated == 1 and truncated[0].prompt_ids == ids("pppp")
    kept = DemonstrationDataset([record, {"prompt": "p", "response": "r"}], TOKENIZER, max_length=8, overlong="skip")
    assert len(kept) == 1 and kept.skipped == 1


def test_fit_example_keeps_the_prompt_end_and_the_response_start():
    assert fit_example([1, 2, 3], [4, 5], 10) == ([1, 2, 3], [4, 5])
    assert fit_example([1, 2, 3, 4, 5, 6], [7, 8], 6) == ([3, 4, 5, 6], [7, 8])
    assert fit_example([1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12], 6) == ([4, 5, 6], [7, 8, 9])


def test_collated_demonstrations_mask_only_the_response():
    rows = list(DemonstrationDataset([{"prompt": "ab", "response": "c"}, {"prompt": "a", "response": "cde"}], TOKENIZER))
    batch = collate_demonstrations(rows, PAD)
    assert batch["loss_mask"].tolist() == [[0, 0, 1, 1, 0], [0, 1, 1, 1, 1]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    assert batch["input_ids"][0, -1].item() == PAD and batch["input_ids"][0, 3].item() == EOS


def test_packing_restarts_positions_per_demonstration():
    rows = list(DemonstrationDataset([{"prompt": "ab", "response": "c"}] * 3, TOKENIZER))  # 4 tokens each
    batch = collate_demonstrations(rows, PAD, packing=True, max_length=10)
    assert batch["input_ids"].shape == (2, 8)
    assert batch["position_ids"][0].tolist() == [0, 1, 2, 3, 0, 1, 2, 3]
    assert batch["position_ids"][1].tolist() == [0, 1, 2, 3, 4, 5, 6, 7]  # padding continues the last one
    assert batch["loss_mask"][0].tolist() == [0, 0, 1, 1, 0, 0, 1, 1] and batch["attention_mask"][1].sum() == 4


def test_preference_pairs_in_both_layouts():
    pairs = PreferenceDataset([{"prompt": "q:", "chosen": " 12", "rejected": " x"}], TOKENIZER)
    row = pairs[0]
    assert row.chosen_sequence_ids == ids("q: 12") and row.rejected_ids == (*ids(" x"), EOS)
    reward = collate_reward_pairs([row], PAD)
    assert reward["chosen_input_ids"].shape == reward["rejected_input_ids"].shape == (1, 5)
    assert reward["rejected_attention_mask"].tolist() == [[1, 1, 1, 1, 0]]
    policy = collate_policy_pairs([row], PAD)
    assert policy["chosen_responses"].tolist() == [[*ids(" 12"), EOS]]
    assert policy["rejected_response_mask"].tolist() == [[1, 1, 1, 0]]
    assert torch.equal(policy["chosen_input_ids"][:, :2], policy["rejected_input_ids"][:, :2])


def test_bad_pairs_name_the_missing_column():
    with pytest.raises(DataFileError, match="pairs.jsonl: record 2: no 'rejected' column"):
        PreferenceDataset([{"prompt": "q", "chosen": "a", "rejected": "b"}, {"prompt": "q", "chosen": "a"}], TOKENIZER,
                          source="pairs.jsonl")


def test_the_digits_task_prefers_digits_in_every_pair():
    task = get_task("digits")
    for pair in task.make_preferences(200, 3):
        digits = [sum(c.isdigit() for c in pair[key]) / len(pair[key].strip()) for key in ("chosen", "rejected")]
        assert digits[0] > digits[1], pair
    demos = task.make_demonstrations(200, 3)
    lettered = sum(not demo["response"].strip().isdigit() for demo in demos)
    assert 60 < lettered < 140 and demos == task.make_demonstrations(200, 3)
