"""RewardWorker: function and model rewards, score placement, and the error messages."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlhfctl.protocol import DataProto
from rlhfctl.single_controller import WorkerMethodError
from rlhfctl.tasks import digits
from tests.workers import reward_fns
from tests.workers.conftest import local_group
from tests.workers.recipes import TINY_MODEL, tiny_recipe, tokenizer
from workers import RewardFunctionError, RewardWorker
from workers.reward import place_scores

RESPONSES = ["12a", "", "7", "xyz9"]


def scored_batch(**extra_columns) -> DataProto:
    """Four samples with texts, right-padded responses (one empty) and an extra column."""
    tok = tokenizer()
    width = 5
    responses = torch.zeros(len(RESPONSES), width, dtype=torch.long)
    mask = torch.zeros_like(responses)
    for row, text in enumerate(RESPONSES):
        ids = tok(text)["input_ids"] + [tok.eos_token_id]
        if text == "":
            ids = []  # nothing generated at all
        responses[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        mask[row, : len(ids)] = 1
    prompts = tok([f"digits {i}:" for i in range(len(RESPONSES))], padding=True, return_tensors="pt")
    columns = {
        "uid": ["a", "a", "b", "b"],
        "prompt_text": [f"digits {i}:" for i in range(len(RESPONSES))],
        "response_text": RESPONSES,
        "ground_truth": ["12", "3", "7", "9"],
        "index": [0, 1, 2, 3],
        **extra_columns,
    }
    return DataProto.from_dict(
        tensors={
            "prompts": prompts["input_ids"],
            "responses": responses,
            "response_mask": mask,
            "attention_mask": torch.cat([prompts["attention_mask"], mask], dim=1),
        },
        non_tensors=columns,
    )


def reward_recipe(**reward) -> dict:
    return tiny_recipe(roles={"reward": {"function": None, **reward}})


def test_module_function_gets_texts_and_columns_and_the_score_sits_on_the_last_token():
    reward_fns.CALLS.clear()
    recipe = reward_recipe(function="tests.workers.reward_fns:length_score", batch_size=3)
    with local_group(RewardWorker, recipe, "reward") as group:
        out = group.compute_rewards(scored_batch())
    assert [call["responses"] for call in reward_fns.CALLS] == [RESPONSES[:3], RESPONSES[3:]]  # batch_size chunks
    first = reward_fns.CALLS[0]
    assert first["prompts"] == ["digits 0:", "digits 1:", "digits 2:"]
    # Every other column, as lists; uid, prompt_text and response_text are not passed.
    assert first["columns"] == {"ground_truth": ["12", "3", "7"], "index": [0, 1, 2]}
    scores = out.batch["token_level_scores"]
    assert scores.shape == (4, 5)
    expected = torch.zeros(4, 5)
    expected[0, 3], expected[1, 0], expected[2, 1], expected[3, 4] = 3.0, 0.0, 1.0, 4.0  # last valid token, or 0
    assert torch.equal(scores, expected)
    assert out.non_tensor_batch["score"].tolist() == [3.0, 0.0, 1.0, 4.0]
    assert out.non_tensor_batch["reward_error"].tolist() == [False] * 4
    assert out.meta_info["reward/errors"] == 0


def test_texts_are_decoded_when_the_batch_has_only_token_ids():
    batch = scored_batch()
    batch.non_tensor_batch.pop("prompt_text")
    batch.non_tensor_batch.pop("response_text")
    reward_fns.CALLS.clear()
    with local_group(RewardWorker, reward_recipe(function="tests.workers.reward_fns:length_score"), "reward") as group:
        out = group.compute_rewards(batch)
    assert reward_fns.CALLS[0]["responses"] == RESPONSES  # EOS skipped, padding dropped
    assert reward_fns.CALLS[0]["prompts"] == [f"digits {i}:" for i in range(4)]
    assert out.non_tensor_batch["score"].tolist() == [3.0, 0.0, 1.0, 4.0]


def test_file_function_relative_to_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "rewards").mkdir()
    (tmp_path / "rewards" / "my_reward.py").write_text(
        "def has_nine(prompts, responses, **columns):\n    return [1.0 if '9' in r else 0.0 for r in responses]\n"
    )
    monkeypatch.chdir(tmp_path)
    with local_group(RewardWorker, reward_recipe(function="rewards/my_reward.py:has_nine"), "reward") as group:
        out = group.compute_rewards(scored_batch())
    assert out.non_tensor_batch["score"].tolist() == [0.0, 0.0, 0.0, 1.0]


def test_bundled_task_is_the_fallback():
    recipe = tiny_recipe()
    recipe["roles"].pop("reward")
    with local_group(RewardWorker, recipe, "reward") as group:
        out = group.compute_rewards(scored_batch())
    assert out.non_tensor_batch["score"].tolist() == digits.score(["p"] * 4, RESPONSES)


@pytest.mark.parametrize(
    ("function", "message"),
    [
        ("tests.workers.reward_fns:wrong_count", r"reward_fns:wrong_count returned 5 scores for 4 samples"),
        ("tests.workers.reward_fns:nan_at_two", r"nan_at_two returned a non-finite score \(nan\) for sample 2"),
    ],
)
def test_bad_return_values_are_value_errors(function, message):
    with local_group(RewardWorker, reward_recipe(function=function), "reward") as group:
        with pytest.raises(WorkerMethodError, match=message) as caught:
            group.compute_rewards(scored_batch())
    assert isinstance(caught.value.__cause__, ValueError)


def test_an_exception_inside_raises_naming_the_chunk():
    recipe = reward_recipe(function="tests.workers.reward_fns:fails_on_second_chunk", batch_size=2)
    with local_group(RewardWorker, recipe, "reward") as group:
        with pytest.raises(WorkerMethodError) as caught:
            group.compute_rewards(scored_batch())
    assert isinstance(caught.value.__cause__, RewardFunctionError)
    assert "fails_on_second_chunk raised RuntimeError: judge unavailable (samples 2..3 of 4)" in str(caught.value)


def test_on_error_zero_scores_the_chunk_zero_and_counts_it():
    recipe = reward_recipe(function="tests.workers.reward_fns:fails_on_second_chunk", batch_size=2, on_error="zero")
    with local_group(RewardWorker, recipe, "reward") as group:
        out = group.compute_rewards(scored_batch())
    assert out.non_tensor_batch["score"].tolist() == [1.0, 1.0, 0.0, 0.0]
    assert out.non_tensor_batch["reward_error"].tolist() == [False, False, True, True]
    assert out.meta_info["reward/errors"] == 2


@pytest.mark.parametrize(
    ("function", "message"),
    [
        ("no_colon_here", r"must be 'package.module:function' or 'path/to/file.py:function'"),
        ("tests.workers.no_such_module:fn", r"cannot import module 'tests.workers.no_such_module'.*NotFound"),
        ("tests.workers.reward_fns:missing", r"'tests.workers.reward_fns' has no attribute 'missing'"),
        ("tests.workers.reward_fns:NOT_CALLABLE", r"is a int, not a callable"),
        ("nowhere/reward.py:fn", r"reward function file 'nowhere/reward.py'.*not found"),
    ],
)
def test_loading_errors_are_reward_function_errors(function, message):
    with pytest.raises(WorkerMethodError, match=message) as caught:
        with local_group(RewardWorker, reward_recipe(function=function), "reward"):
            pass
    assert isinstance(caught.value.__cause__, RewardFunctionError)


def test_a_file_that_fails_to_import_is_reported(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("raise ImportError('needs a package that is not installed')\n")
    with pytest.raises(WorkerMethodError, match=r"importing reward function file .*broken.py.*needs a package"):
        with local_group(RewardWorker, reward_recipe(function=f"{broken}:fn"), "reward"):
            pass


def test_model_reward_reads_the_classifier_at_the_last_token():
    from rlhfctl.models.loading import load_sequence_classifier

    recipe = reward_recipe(model=dict(TINY_MODEL))
    with local_group(RewardWorker, recipe, "reward") as group:
        out = group.compute_rewards(scored_batch())
    classifier = load_sequence_classifier(TINY_MODEL, tokenizer(), seed=0).eval()
    expected = []
    with torch.no_grad():
        for i, response in enumerate(RESPONSES):
            ids = torch.tensor([tokenizer()(f"digits {i}:" + response)["input_ids"]])
            expected.append(float(classifier(input_ids=ids).logits[0, 0]))
    np.testing.assert_allclose(out.non_tensor_batch["score"], expected, rtol=1e-5, atol=1e-5)


def test_place_scores_handles_empty_and_full_rows():
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 1, 1]])
    placed = place_scores(torch.tensor([2.0, 3.0, 4.0]), mask)
    assert placed.tolist() == [[0.0, 2.0, 0.0], [3.0, 0.0, 0.0], [0.0, 0.0, 4.0]]


RM_TEMPLATE = "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} {% endfor %}{% if add_generation_prompt %}=> {% endif %}"


def test_a_reward_model_renders_chat_prompts_with_its_own_chat_template():
    """The policy's rendering ("user: ...\\nassistant: ") is replaced by the reward tokenizer's template."""
    from rlhfctl.models.loading import load_sequence_classifier

    chats = [[{"role": "user", "content": f"digits {i}:"}] for i in range(len(RESPONSES))]
    batch = scored_batch(prompt_messages=chats)
    batch.non_tensor_batch["prompt_text"] = np.array([f"user: digits {i}:\nassistant: " for i in range(4)], dtype=object)
    rm_model = {**TINY_MODEL, "chat_template": RM_TEMPLATE}
    with local_group(RewardWorker, reward_recipe(model=rm_model), "reward") as group:
        out = group.compute_rewards(batch)
    classifier = load_sequence_classifier(TINY_MODEL, tokenizer(), seed=0).eval()

    def score(text: str) -> float:
        with torch.no_grad():
            return float(classifier(input_ids=torch.tensor([tokenizer()(text)["input_ids"]])).logits[0, 0])

    own = [score(f"<user> digits {i}: => " + response) for i, response in enumerate(RESPONSES)]
    policy = [score(f"user: digits {i}:\nassistant: " + response) for i, response in enumerate(RESPONSES)]
    np.testing.assert_allclose(out.non_tensor_batch["score"], own, rtol=1e-5, atol=1e-5)
    assert not np.allclose(own, policy)


def test_chat_prompts_carry_their_messages_but_reward_functions_do_not_see_them():
    from rlhfctl.data.prompts import PromptDataset, collate_prompts

    dataset = PromptDataset([{"prompt": "digits 1:", "ground_truth": "1"}], tokenizer=tokenizer(),
                            apply_chat_template=True)
    columns = collate_prompts([dataset[0]], tokenizer()).columns
    assert columns["prompt_messages"] == [[{"role": "user", "content": "digits 1:"}]]
    reward_fns.CALLS.clear()
    recipe = reward_recipe(function="tests.workers.reward_fns:length_score")
    with local_group(RewardWorker, recipe, "reward") as group:
        group.compute_rewards(scored_batch(prompt_messages=[[{"role": "user", "content": "x"}]] * 4))
    assert "prompt_messages" not in reward_fns.CALLS[-1]["columns"] and "ground_truth" in reward_fns.CALLS[-1]["columns"]
