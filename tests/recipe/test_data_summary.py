"""validate reads what a data file holds (rows, columns, prompt form, ground-truth key) and stops, before any
worker starts, on a reward function that needs a ground_truth the sampled rows do not give."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from rlhfctl.recipe import load_recipe, validate_recipe
from tests.data.verl_rows import gsm8k_rows, write_jsonl, write_parquet
from tests.recipe.builders import recipe_data, write_recipe

REWARDS = '''
def needs_truth(prompts, responses, ground_truth, **columns):
    return [0.0 for _ in responses]

def may_take_truth(prompts, responses, ground_truth=None, **columns):
    return [0.0 for _ in responses]

def strict(prompts, responses, ground_truth, data_source, ability, reward_model, extra_info):
    return [0.0 for _ in responses]
'''


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory holding rewards.py, a verl train.parquet (12 rows) and test.jsonl (3 rows)."""
    (tmp_path / "rewards.py").write_text(REWARDS)
    write_parquet(tmp_path / "train.parquet", gsm8k_rows(12))
    write_jsonl(tmp_path / "test.jsonl", gsm8k_rows(3, "test"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("rewards", None)
    return tmp_path


def _report(folder: Path, function: str = "rewards.py:needs_truth", train: str = "train.parquet", **data):
    recipe = recipe_data(data={"train_files": [train], "val_files": ["test.jsonl"], **data})
    recipe["roles"]["reward"]["function"] = function
    return validate_recipe(load_recipe(write_recipe(folder, recipe)))


def test_a_verl_file_is_summarized_with_its_rows_columns_prompt_form_and_ground_truth_key(workdir):
    report = _report(workdir)
    assert report.ok, [issue.message for issue in report.errors]
    train, val = report.data
    assert (train.key, train.path, train.rows, train.sampled) == ("data.train_files[0]", "train.parquet", 12, 12)
    assert train.columns == ("data_source", "prompt", "ability", "reward_model", "extra_info")
    assert train.prompt == "messages -> chat template"
    assert (train.ground_truth, train.ground_truth_rows) == ("reward_model.ground_truth", 12)
    assert (val.key, val.rows, val.prompt) == ("data.val_files[0]", 3, "messages -> chat template")
    assert report.to_dict()["data"][0]["ground_truth"] == "reward_model.ground_truth"


def test_the_reward_columns_checked_are_the_lifted_ones(workdir):
    assert _report(workdir, "rewards.py:strict").ok  # takes ground_truth and every verl column, no **columns


@pytest.mark.parametrize("setting, prompt", [(None, "text"), (True, "text -> chat template"), (False, "text")])
def test_text_prompts_get_the_template_only_when_asked(workdir, setting, prompt):
    write_jsonl(workdir / "text.jsonl", [{"prompt": "2+2?", "ground_truth": "4"}])
    report = _report(workdir, train="text.jsonl", apply_chat_template=setting)
    assert report.data[0].prompt == prompt and report.data[0].ground_truth == "ground_truth"


def test_messages_with_apply_chat_template_false_is_an_error_naming_the_file_and_record(workdir):
    report = _report(workdir, apply_chat_template=False)
    assert [issue.key_path for issue in report.errors] == ["data.train_files[0]", "data.val_files[0]"]
    assert "train.parquet: record 1: the prompt is a list of messages; set apply_chat_template to null or true" in (
        report.errors[0].message)


def test_ground_truth_missing_from_every_sampled_row_names_the_file_the_key_and_where_verl_keeps_it(workdir):
    rows = gsm8k_rows(4)
    for row in rows:
        row["reward_model"] = {"style": "model"}
    write_parquet(workdir / "bare.parquet", rows)
    report = _report(workdir, train="bare.parquet")
    assert [issue.key_path for issue in report.errors] == ["data.train_files[0]"]
    message = report.errors[0].message
    assert message.startswith("data.train_files[0]: bare.parquet: none of the first 4 rows has a ground_truth")
    assert "roles.reward.function needs_truth needs it" in message and "reward_model: {ground_truth: ...}" in message
    assert report.data[0].ground_truth is None


def test_ground_truth_null_in_every_sampled_row_is_an_error(workdir):
    rows = gsm8k_rows(4)
    for row in rows:
        row["reward_model"]["ground_truth"] = None
    write_jsonl(workdir / "nulls.jsonl", rows)
    message = _report(workdir, train="nulls.jsonl").errors[0].message
    assert "nulls.jsonl: ground_truth is null in each of the first 4 rows (read from reward_model.ground_truth)" in (
        message)


def test_a_function_that_does_not_need_ground_truth_takes_rows_without_one(workdir):
    (workdir / "plain.jsonl").write_text(json.dumps({"prompt": "q"}) + "\n")
    assert _report(workdir, "rewards.py:may_take_truth", train="plain.jsonl").ok
    assert _report(workdir, "tests.recipe.stub_workers:reward_fn", train="plain.jsonl").ok


def test_the_example_prompt_of_a_verl_file_is_rendered_with_the_chat_template_under_null(workdir):
    from tests.recipe.test_example_prompt import save_char_tokenizer, save_config

    model = workdir / "model"
    save_config(model, save_char_tokenizer(model))
    recipe = recipe_data(data={"train_files": ["train.parquet"], "max_prompt_length": 120})
    recipe["roles"]["actor"]["model"] = {"path": str(model)}
    recipe["roles"]["reward"]["function"] = "rewards.py:needs_truth"
    report = validate_recipe(load_recipe(write_recipe(workdir, recipe), ["rollout.max_new_tokens=8"]))
    content = gsm8k_rows(1)[0]["prompt"][0]["content"]
    assert report.example is not None and report.example.chat_template
    assert report.example.text == f"user: {content}\nassistant: "


def test_a_verl_file_with_a_tokenizer_without_a_chat_template_is_an_error_naming_file_and_record(workdir):
    from tests.recipe.test_example_prompt import save_config, save_word_level

    model = workdir / "model"
    save_config(model, save_word_level(model, list("abcdefghijklmnopqrstuvwxyz ")))
    recipe = recipe_data(data={"train_files": ["train.parquet"], "max_prompt_length": 120})
    recipe["roles"]["actor"]["model"] = {"path": str(model)}
    recipe["roles"]["reward"]["function"] = "rewards.py:needs_truth"
    report = validate_recipe(load_recipe(write_recipe(workdir, recipe), ["rollout.max_new_tokens=8"]))
    assert [issue.key_path for issue in report.errors] == ["data.train_files[0]"]
    assert ("data.train_files[0]: train.parquet: record 1: the prompt is a list of {role, content} messages, rendered "
            "with the chat template, but the tokenizer has none") in report.errors[0].message
