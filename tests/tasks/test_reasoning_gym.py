"""reasoning-gym tasks (data.task: reasoning_gym:<dataset>[?key=value&...], data.tasks mixtures): prompts, the
reward against reasoning-gym's own scoring, the name rule and its errors, and validate's task listing."""

from __future__ import annotations

import json
import sys
from collections import Counter

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from rlhfctl.cli import app
from rlhfctl.protocol import DataProto
from rlhfctl.recipe import RecipeError, load_recipe
from rlhfctl.recipe.resolved import resolve_mapping
from rlhfctl.recipe.validate import validate_recipe
from rlhfctl.tasks import UnknownTaskError, get_task, mixture, mixture_task, task_name_problem
from rlhfctl.tasks import reasoning_gym as rg_task
from rlhfctl.trainer.metrics import source_reward_metrics
from rlhfctl.trainer.prompt_source import source_records
from tests.workers.conftest import local_group
from tests.workers.recipes import tiny_recipe, tokenizer
from workers import RewardWorker

reasoning_gym = pytest.importorskip("reasoning_gym")
from reasoning_gym.utils import extract_answer  # noqa: E402  (after the skip: an optional extra)

SUMS = "reasoning_gym:basic_arithmetic?max_terms=2&max_digits=1&operators=[+]&allow_parentheses=false"
SUMS_CONFIG = {"max_terms": 2, "max_digits": 1, "operators": ["+"], "allow_parentheses": False}
LEGS = "reasoning_gym:leg_counting?min_animals=1&max_animals=2"


def _columns(records: list[dict]) -> dict[str, list]:
    return {key: [record[key] for record in records] for key in records[0] if key != "prompt"}


def _responses(answers: list[str]) -> list[str]:
    """Per entry: right, wrong, untagged, tagged twice (the last counts), spaced, with words around the number."""
    made = []
    for index, answer in enumerate(answers):
        made.append([
            f"<answer>{answer}</answer>",
            f"<answer>{int(answer) + 1}</answer>",
            answer,
            f"<answer>{int(answer) + 3}</answer> no, <answer>{answer}</answer>",
            f"<answer>  {answer} </answer>",
            f"<answer>{answer} legs</answer>",
            "",
        ][index % 7])
    return made


# ---------------------------------------------------------------------------------- the reward
@pytest.mark.parametrize("name, dataset, config", [
    (SUMS, "basic_arithmetic", SUMS_CONFIG),
    (LEGS, "leg_counting", {"min_animals": 1, "max_animals": 2}),
])
def test_the_reward_is_reasoning_gyms_own_score_answer_of_the_tagged_answer(name, dataset, config):
    records = get_task(name).make_prompts(21, seed=5)
    responses = _responses([record["ground_truth"] for record in records])
    scored = rg_task.score([r["prompt"] for r in records], responses, **_columns(records))
    own = reasoning_gym.create_dataset(dataset, seed=5, size=21, **config)
    expected = [float(own.score_answer(extract_answer(response), own[index])) for index, response in enumerate(responses)]
    assert [item["score"] for item in scored] == expected
    assert [item["acc"] for item in scored] == [1.0 if value == 1.0 else 0.0 for value in expected]
    kinds = set(expected)
    assert 1.0 in kinds and 0.0 in kinds and any(0 < value < 1 for value in kinds)  # right, wrong and partial credit
    assert [item["score"] for item in scored[:4]] == [1.0, 0.0, 0.0, 1.0]  # right, wrong, untagged, last tag counts


def test_the_reward_refuses_an_entry_that_regenerates_differently():
    records = get_task(SUMS).make_prompts(2, seed=0)
    columns = _columns(records)
    columns["ground_truth"] = ["999", columns["ground_truth"][1]]
    with pytest.raises(ValueError, match="regenerated entry 0 with answer .* ground_truth is '999'"):
        rg_task.score(["a", "b"], ["<answer>1</answer>"] * 2, **columns)


def test_records_carry_the_prompt_format_the_source_and_a_json_safe_entry_reference():
    record = get_task(SUMS).make_prompts(1, seed=3)[0]
    own = reasoning_gym.create_dataset("basic_arithmetic", seed=3, size=1, **SUMS_CONFIG)[0]
    assert record["prompt"] == own["question"] + "\nGive only the final answer, between <answer> and </answer>."
    assert record["ground_truth"] == own["answer"] and record["data_source"] == "reasoning_gym/basic_arithmetic"
    reference = record[rg_task.ENTRY_COLUMN]
    assert json.loads(json.dumps(reference)) == reference == {
        "dataset": "basic_arithmetic", "config": SUMS_CONFIG, "seed": 3, "size": 1, "index": 0}
    assert rg_task.entry_of(reference) == own


def test_demonstrations_answer_in_the_format_the_reward_reads():
    demos = get_task(LEGS).make_demonstrations(6, 1)
    assert [demo["prompt"] for demo in demos] == [record["prompt"] for record in get_task(LEGS).make_prompts(6, 1)]
    scored = rg_task.score([d["prompt"] for d in demos], [d["response"] for d in demos], **_columns(
        [{k: v for k, v in demo.items() if k != "response"} for demo in demos]))
    assert [item["acc"] for item in scored] == [1.0] * 6


# ---------------------------------------------------------------------------------- prompts per split, mixtures
def _recipe(**data) -> object:
    return resolve_mapping({"data": {"num_train": 12, "num_val": 6, **data}, "trainer": {"seed": 7, "val_every": 1}})


def test_prompts_are_the_same_for_a_seed_and_validation_draws_with_another():
    recipe = _recipe(task=SUMS)
    train, again, val = source_records(recipe, "train"), source_records(recipe, "train"), source_records(recipe, "val")
    assert train == again and len(train) == 12 and len(val) == 6
    assert {r["reasoning_gym"]["seed"] for r in train} == {7} and {r["reasoning_gym"]["seed"] for r in val} == {1_000_010}
    assert [r["prompt"] for r in val] != [r["prompt"] for r in train[:6]]
    other_seed = resolve_mapping({"data": {"task": SUMS, "num_train": 12}, "trainer": {"seed": 8}})
    assert [r["prompt"] for r in source_records(other_seed, "train")] != [r["prompt"] for r in train]


def test_apportion_gives_exact_shares_that_sum_to_the_count():
    assert mixture.apportion(300, [2, 1]) == [200, 100]
    assert mixture.apportion(10, [1, 1, 1]) == [4, 3, 3]  # the remainder goes to the earlier task
    assert mixture.apportion(7, [0.5, 3]) == [1, 6]
    assert mixture.apportion(0, [1, 2]) == [0, 0]
    with pytest.raises(ValueError, match="positive"):
        mixture.apportion(4, [1, 0])


def test_a_mixture_honours_the_weights_and_each_task_draws_as_it_would_alone():
    task = mixture_task([{"name": LEGS, "weight": 2}, {"name": SUMS}])
    records = task.make_prompts(300, seed=4)
    sources = [record["data_source"] for record in records]
    assert Counter(sources) == {"reasoning_gym/leg_counting": 200, "reasoning_gym/basic_arithmetic": 100}
    assert sources[:100].count("reasoning_gym/basic_arithmetic") not in (0, 100)  # interleaved, not in blocks
    assert task.make_prompts(300, seed=4) == records and task.make_prompts(300, seed=5) != records
    legs = [record for record in records if record["data_source"] == "reasoning_gym/leg_counting"]
    assert legs == get_task(LEGS).make_prompts(200, seed=4)
    assert task.score is rg_task.score


def test_a_recipes_mixture_is_what_the_trainer_reads():
    recipe = _recipe(tasks=[{"name": LEGS, "weight": 1}, {"name": SUMS, "weight": 3}])
    assert Counter(r["data_source"] for r in source_records(recipe, "train")) == {
        "reasoning_gym/leg_counting": 3, "reasoning_gym/basic_arithmetic": 9}
    assert Counter(r["data_source"] for r in source_records(recipe, "val")) == {
        "reasoning_gym/leg_counting": 2, "reasoning_gym/basic_arithmetic": 4}  # 1.5 and 4.5: the tie to the first


# ---------------------------------------------------------------------------------- names and their errors
@pytest.mark.parametrize("override, expected", [
    ("data.task=reasoning_gym:leg_countin", "reasoning-gym has no dataset 'leg_countin'; close names: leg_counting"),
    ("data.task=reasoning_gym:leg_counting?legs=3",
     "leg_counting has no config key 'legs'; its keys: min_animals, max_animals, min_instances, max_instances"),
    ("data.task=reasoning_gym:leg_counting?min_animals=0", "reasoning-gym rejects the config of leg_counting: min_animals must be positive"),
    ("data.task=reasoning_gym:leg_counting?seed=3", "'seed' is set by rlhfctl (trainer.seed)"),
    ("data.task=reasoning_gym:leg_counting?min_animals", "'min_animals' is not key=value in the query"),
    ("data.task=digts", "'digts' is not one of: arithmetic, arithmetic-direct, code_echo, copy, digits, repeat, or reasoning_gym:<dataset>"),
])
def test_a_bad_task_name_is_a_load_error_naming_data_task(override, expected):
    with pytest.raises(RecipeError) as caught:
        load_recipe("recipes/quickstart.yaml", [override])
    assert caught.value.key_path == "data.task" and str(caught.value).startswith("data.task: ")
    assert expected in str(caught.value)


def test_a_reasoning_gym_name_loads_and_get_task_names_the_problem_otherwise():
    assert load_recipe("recipes/quickstart.yaml", [f"data.task={SUMS}"]).data.task == SUMS
    assert task_name_problem(SUMS) is None and task_name_problem("digits") is None
    with pytest.raises(UnknownTaskError, match="no dataset 'nope'"):
        get_task("reasoning_gym:nope")


def test_without_the_extra_validate_exits_2_with_one_line_naming_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym.factory", None)  # what an uninstalled package gives: ImportError
    message = "data.task: reasoning-gym tasks need the reasoning-gym package: pip install 'rlhfctl[reasoning-gym]'"
    with pytest.raises(RecipeError) as caught:
        load_recipe("recipes/quickstart.yaml", ["data.task=reasoning_gym:leg_counting?max_animals=4"])
    assert caught.value.key_path == "data.task" and str(caught.value) == message
    result = CliRunner().invoke(app, ["validate", "reasoning-gym-quickstart"])
    assert result.exit_code == 2 and result.stderr.strip().splitlines() == [f"error: {message}"]


def test_validate_names_each_bad_mixture_entry():
    cfg = load_recipe("recipes/quickstart.yaml", [
        "~data.task",
        "data.tasks=[{name: digits}, {name: 'reasoning_gym:leg_countng', weight: 2}, {name: '" + SUMS + "', weight: 0, w: 1}]",
    ])
    errors = {issue.key_path: issue.message for issue in validate_recipe(cfg).errors}
    assert "a mixture takes reasoning_gym:<dataset>" in errors["data.tasks[0].name"]
    assert "close names: leg_counting" in errors["data.tasks[1].name"]
    assert errors["data.tasks[2].weight"] == "data.tasks[2].weight: must be a positive number, got 0"
    assert errors["data.tasks[2].w"].startswith("data.tasks[2].w: unknown key 'w'")


def test_a_mixture_with_data_task_or_a_supervised_stage_is_an_error():
    both = load_recipe("recipes/quickstart.yaml", [f"data.tasks=[{{name: '{LEGS}'}}]"])
    assert "data.tasks: set data.task ('digits') or data.tasks, not both" in [i.message for i in validate_recipe(both).errors]
    sft = load_recipe("recipes/sft-quickstart.yaml", ["~data.task", f"data.tasks=[{{name: '{LEGS}'}}]"])
    assert any(i.key_path == "data.tasks" and "algorithm.name=sft reads one data.task" in i.message
               for i in validate_recipe(sft).errors)


# ---------------------------------------------------------------------------------- validate's listing
def test_validate_lists_each_task_its_split_sizes_and_an_example(tmp_path):
    runner = CliRunner()
    mix = f"data.tasks=[{{name: '{LEGS}', weight: 2}}, {{name: '{SUMS}'}}]"
    args = ["validate", "reasoning-gym-quickstart", "~data.task", mix, "data.max_prompt_length=256",
            "roles.actor.model.config.max_position_embeddings=512", "data.num_train=90", "data.num_val=9"]
    result = runner.invoke(app, [*args, "--format", "json"])
    assert result.exit_code == 0, result.output
    tasks = json.loads(result.stdout)["tasks"]
    assert [(t["key"], t["data_source"], t["weight"], t["train"], t["val"]) for t in tasks] == [
        ("data.tasks[0]", "reasoning_gym/leg_counting", 2.0, 60, 6),
        ("data.tasks[1]", "reasoning_gym/basic_arithmetic", 1.0, 30, 3),
    ]
    assert tasks[1]["example"] == get_task(SUMS).make_prompts(1, 0)[0]["prompt"]
    table = runner.invoke(app, args)
    assert table.exit_code == 0 and "Tasks (prompts generated at run time" in table.stdout
    assert "data.tasks[0]" in table.stdout and "data.tasks[1]" in table.stdout  # (narrow: the other cells fold)


def test_validate_exits_2_with_one_line_for_an_unknown_dataset():
    result = CliRunner().invoke(app, ["validate", "reasoning-gym-quickstart", "data.task=reasoning_gym:basic_arithmetc"])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        "error: data.task: 'reasoning_gym:basic_arithmetc': reasoning-gym has no dataset 'basic_arithmetc'; "
        "close names: basic_arithmetic, bitwise_arithmetic, decimal_arithmetic, complex_arithmetic, calendar_arithmetic"]


# ---------------------------------------------------------------------------------- per-source training metrics
def test_batch_reward_is_split_by_data_source():
    rewards = torch.tensor([1.0, 0.0, 0.5, 1.0, 0.25])
    columns = {"data_source": np.array(["rg/a", "rg/b", "rg/a", "rg/b", "acc"], dtype=object),
               "reward/acc": np.array([1, 0, 0, 1, 0], dtype=object)}
    assert source_reward_metrics(rewards, columns) == {"reward/rg/a/mean": 0.75, "reward/rg/b/mean": 0.5}  # 'acc' is a score's
    assert source_reward_metrics(rewards, {}) == {}


# ---------------------------------------------------------------------------------- through the reward worker
def _scored_batch(records: list[dict], responses: list[str]) -> DataProto:
    """The generated records with these responses, as the reward worker receives a rolled-out batch."""
    tok = tokenizer()
    ids = [tok(text)["input_ids"] + [tok.eos_token_id] for text in responses]
    width = max(len(row) for row in ids)
    tokens, mask = torch.zeros(len(ids), width, dtype=torch.long), torch.zeros(len(ids), width, dtype=torch.long)
    for row, row_ids in enumerate(ids):
        tokens[row, : len(row_ids)], mask[row, : len(row_ids)] = torch.tensor(row_ids), 1
    prompts = tok([record["prompt"] for record in records], padding=True, return_tensors="pt")
    columns = {key: [record[key] for record in records] for key in ("ground_truth", "data_source", "reasoning_gym")}
    return DataProto.from_dict(
        tensors={"prompts": prompts["input_ids"], "responses": tokens, "response_mask": mask,
                 "attention_mask": torch.cat([prompts["attention_mask"], mask], dim=1)},
        non_tensors={"uid": [f"u{i}" for i in range(len(records))], "prompt_text": [r["prompt"] for r in records],
                     "response_text": responses, **columns},
    )


@pytest.mark.parametrize("data, reward", [
    ({"task": None, "tasks": [{"name": LEGS}, {"name": SUMS, "weight": 1}]}, {"function": "rlhfctl.tasks.reasoning_gym:score"}),
    ({"task": SUMS}, {"function": None}),  # no function: the worker falls back to the task's own reward
])
def test_the_reward_worker_scores_as_reasoning_gym_and_the_batch_reward_splits_by_source(data, reward):
    recipe = tiny_recipe(data=data, roles={"reward": reward})
    records = (mixture_task(data["tasks"]) if data.get("tasks") else get_task(data["task"])).make_prompts(14, seed=0)
    responses = _responses([record["ground_truth"] for record in records])
    batch = _scored_batch(records, responses)
    with local_group(RewardWorker, recipe, "reward") as group:
        out = batch.union(group.compute_rewards(batch))  # what the trainer's batch then holds
    expected = []
    for record, response in zip(records, responses):
        reference = record["reasoning_gym"]
        own = reasoning_gym.create_dataset(reference["dataset"], seed=0, size=reference["size"], **reference["config"])
        expected.append(float(own.score_answer(extract_answer(response), own[reference["index"]])))
    assert out.non_tensor_batch["score"].tolist() == expected
    assert out.non_tensor_batch["reward/acc"].tolist() == [1.0 if value == 1.0 else 0.0 for value in expected]
    by_source: dict[str, list[float]] = {}
    for record, value in zip(records, expected):
        by_source.setdefault(record["data_source"], []).append(value)
    metrics = source_reward_metrics(out.batch["token_level_scores"].sum(-1), out.non_tensor_batch)
    assert metrics == pytest.approx({f"reward/{source}/mean": float(np.mean(values)) for source, values in by_source.items()})
    assert len(metrics) == (2 if data.get("tasks") else 1) and 0 < sum(expected) < len(expected)


def test_the_bundled_pipeline_checks_both_stages():
    result = CliRunner().invoke(app, ["validate", "recipes/reasoning-gym-pipeline.yaml", "--format", "json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [(stage["name"], stage["algorithm"]) for stage in report["stages"]] == [("sft", "sft"), ("grpo", "ppo")]
