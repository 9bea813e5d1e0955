"""The bundled repeat task (data.task: repeat[?max_len=&alpha=]): deterministic prompts, a heavy-tailed length
distribution, hand-checked rewards, its settings and their errors in validate, and two training steps on it."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from rlhfctl.cli import app
from rlhfctl.recipe import RecipeError, load_recipe
from rlhfctl.recipe.json_schema import recipe_json_schema
from rlhfctl.recipe.resolved import resolve
from rlhfctl.tasks import UnknownTaskError, get_task, repeat, task_name_problem, task_names
from rlhfctl.trainer.prompt_source import source_records

DEFAULTS = repeat.RepeatSettings()


# ---------------------------------------------------------------------------------- prompts
def test_prompts_are_deterministic_per_seed_and_ask_for_their_digits_again():
    records = repeat.make_prompts(DEFAULTS, 200, seed=3)
    assert records == repeat.make_prompts(DEFAULTS, 200, seed=3)
    assert records != repeat.make_prompts(DEFAULTS, 200, seed=4)
    for record in records:
        assert re.fullmatch(r"repeat (\d+):", record["prompt"]).group(1) == record["ground_truth"]
    assert repeat.make_prompts(DEFAULTS, 0, seed=3) == []
    with pytest.raises(ValueError, match="non-negative"):
        repeat.make_prompts(DEFAULTS, -1, seed=3)


def test_the_task_is_registered_and_its_settings_come_from_the_name():
    assert "repeat" in task_names()
    task = get_task("repeat")
    assert task.score is repeat.score
    assert task.make_prompts(5, 1) == repeat.make_prompts(DEFAULTS, 5, 1)
    short = get_task("repeat?max_len=4&alpha=0.5")
    assert short.name == "repeat?max_len=4&alpha=0.5"
    assert max(repeat.target_lengths(repeat.RepeatSettings(4, 0.5), 500, 0)) == 4
    assert short.make_prompts(500, 0) == repeat.make_prompts(repeat.RepeatSettings(4, 0.5), 500, 0)


def test_demonstrations_answer_exactly_and_score_one():
    demonstrations = get_task("repeat?max_len=16").make_demonstrations(20, 2)
    prompts = repeat.make_prompts(repeat.RepeatSettings(16), 20, 2)
    assert [d["prompt"] for d in demonstrations] == [p["prompt"] for p in prompts]
    assert all(d["response"] == d["ground_truth"] for d in demonstrations)
    prompts = [d["prompt"] for d in demonstrations]
    assert repeat.score(prompts, [d["response"] for d in demonstrations], [d["ground_truth"] for d in demonstrations]) == [1.0] * 20


# ---------------------------------------------------------------------------------- the length distribution
def test_the_default_lengths_are_heavy_tailed_and_the_same_for_a_seed():
    quantiles = repeat.length_quantiles(DEFAULTS, 10_000, seed=0)
    assert quantiles == repeat.length_quantiles(DEFAULTS, 10_000, seed=0)
    assert quantiles == {0.5: 1, 0.9: 6, 0.99: 42, 1.0: 64}  # the numbers docs/rollout.md quotes
    assert quantiles[0.5] <= DEFAULTS.max_len / 8 and quantiles[0.99] >= DEFAULTS.max_len / 2
    for seed in (1, 2):
        other = repeat.length_quantiles(DEFAULTS, 4_000, seed=seed)
        assert other[0.5] <= DEFAULTS.max_len / 8 and other[0.99] >= DEFAULTS.max_len / 2


@pytest.mark.parametrize("settings", [DEFAULTS, repeat.RepeatSettings(max_len=200, alpha=0.8)])
def test_the_tail_follows_the_pareto_law_and_the_cap_holds_the_rest(settings):
    lengths = repeat.target_lengths(settings, 20_000, seed=5)
    assert min(lengths) >= 1 and max(lengths) == settings.max_len
    for j in (2, 4, 8, 32):  # P(length >= j) = j ** -alpha below the cap, within 0.01
        assert sum(k >= j for k in lengths) / len(lengths) == pytest.approx(j ** -settings.alpha, abs=0.01)
    at_cap = sum(k == settings.max_len for k in lengths) / len(lengths)
    assert at_cap == pytest.approx(settings.max_len ** -settings.alpha, abs=0.003)


def test_a_larger_alpha_is_a_lighter_tail():
    heavy = repeat.length_quantiles(repeat.RepeatSettings(alpha=0.8), 4_000, seed=0)
    light = repeat.length_quantiles(repeat.RepeatSettings(alpha=3.0), 4_000, seed=0)
    assert light[0.99] < heavy[0.99] and heavy[0.99] == 64
    with pytest.raises(ValueError, match=r"in \(0, 1\]"):
        repeat.length_quantiles(DEFAULTS, 10, seed=0, quantiles=(0.0,))


# ---------------------------------------------------------------------------------- the reward
@pytest.mark.parametrize("response, expected", [
    ("38172", 1.0),             # exact (ended with EOS: generation stopped before the budget)
    ("381", 0.6),               # a prefix: 3 of 5
    ("38199", 0.6),             # the first 3 match, then wrong
    ("3817222", 0.6),           # the answer, then 2 more: ended late, 5 - 2 of 5
    ("38172" + "0" * 5, 0.0),   # as many extra characters as the answer: nothing left
    ("", 0.0),                  # empty
    ("9", 0.0),                 # wrong from the first digit
    (" 38172", 0.0),            # a leading space is a mismatch at the first character
])
def test_reward_values_by_hand(response, expected):
    assert repeat.score(["repeat 38172:"], [response], ["38172"]) == [pytest.approx(expected, abs=1e-12)]


def test_the_reward_checks_its_columns_line_up():
    assert repeat.score(["p", "q"], ["", "x"], [None, ""]) == [1.0, 0.0]  # an empty answer: only empty is exact
    with pytest.raises(ValueError, match="column 'ground_truth' has 1 values for 2 responses"):
        repeat.score(["p", "q"], ["1", "2"], ["1"])


# ---------------------------------------------------------------------------------- settings and their errors
@pytest.mark.parametrize("name, expected", [
    ("repeat?max_len=0", "'repeat?max_len=0': max_len must be a whole number of digits >= 1, got 0"),
    ("repeat?max_len=2.5", "max_len must be a whole number of digits >= 1, got 2.5"),
    ("repeat?max_len=true", "max_len must be a number, got True"),
    ("repeat?alpha=0", "alpha must be a positive number (the tail exponent, e.g. 1.2), got 0"),
    ("repeat?alpha=.inf", "alpha must be a positive number"),
    ("repeat?alpha=fast", "alpha must be a positive number (the tail exponent, e.g. 1.2), got 'fast'"),
    ("repeat?tail=2", "'repeat?tail=2': the repeat task has no setting 'tail'; its settings: max_len, alpha"),
    ("repeat?max_len", "'repeat?max_len': 'max_len' is not key=value in the query"),
    ("repeat?alpha=1&alpha=2", "'alpha' is set twice in the query"),
    ("digits?max_len=3", "'digits?max_len=3': the digits task takes no settings; write digits"),
])
def test_bad_settings_are_named(name, expected):
    assert expected in task_name_problem(name)
    with pytest.raises(UnknownTaskError, match=re.escape(expected)):
        get_task(name)


def test_validate_exits_2_with_one_line_naming_data_task():
    result = CliRunner().invoke(app, ["validate", "quickstart", "data.task=repeat?max_len=0"])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        "error: data.task: 'repeat?max_len=0': max_len must be a whole number of digits >= 1, got 0"]
    with pytest.raises(RecipeError) as caught:
        load_recipe("recipes/quickstart.yaml", ["data.task=repeat?alpha=-1"])
    assert caught.value.key_path == "data.task"


def test_validate_lists_the_task_with_its_first_prompt():
    args = ["validate", "quickstart", "data.task=repeat?max_len=7", "roles.reward.function=rlhfctl.tasks.repeat:score"]
    result = CliRunner().invoke(app, [*args, "--format", "json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    [listed] = report["tasks"]
    assert (listed["key"], listed["name"]) == ("data.task", "repeat?max_len=7")
    assert listed["example"] == repeat.make_prompts(repeat.RepeatSettings(7), 1, 0)[0]["prompt"]
    assert not [issue for issue in report.get("warnings", []) if "roles.reward.function" in json.dumps(issue)]


def test_the_json_schema_takes_a_name_with_settings():
    options = recipe_json_schema()["properties"]["data"]["properties"]["task"]["anyOf"]
    assert "repeat" in options[0]["enum"]
    patterns = [option["pattern"] for option in options if "pattern" in option]
    assert any(re.search(p, "repeat?max_len=8&alpha=1.5") for p in patterns)
    assert not any(re.search(p, "digits?max_len=8") for p in patterns)


# ---------------------------------------------------------------------------------- training
@pytest.mark.slow
def test_two_grpo_steps_on_the_task_score_each_sample_with_its_reward(ray_session, tmp_path):
    output = tmp_path / "run"
    overrides = [
        "data.task=repeat?max_len=7", "roles.reward.function=rlhfctl.tasks.repeat:score", "rollout.max_new_tokens=8",
        "trainer.total_steps=2", "trainer.batch_size=4", "trainer.mini_batch_size=4", "rollout.n=2",
        "trainer.log_samples=4", f"trainer.output_dir={output}",
    ]
    result = CliRunner().invoke(app, ["train", "quickstart", *overrides, "--quiet"])
    assert result.exit_code == 0, result.output
    steps = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [step["step"] for step in steps] == [1, 2]
    recipe = resolve(load_recipe("recipes/quickstart.yaml", overrides))
    truths = {record["prompt"]: record["ground_truth"] for record in source_records(recipe, "train")}
    samples = [json.loads(line) for line in (output / "samples.jsonl").read_text().splitlines() if line.strip()]
    assert samples and {sample["step"] for sample in samples} == {1, 2}
    for sample in samples:
        expected = repeat.score([sample["prompt"]], [sample["response"]], [truths[sample["prompt"]]])[0]
        assert sample["score"] == pytest.approx(expected, abs=1e-6)
