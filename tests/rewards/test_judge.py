"""The LLM judge (roles.reward.judge): its template, the bundled and user parsers, the scores verdicts parse to,
the recipe checks naming roles.reward.judge.<key>, and the reward worker scoring with a tiny judge model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlhfctl.protocol import DataProto
from rlhfctl.recipe import load_recipe
from rlhfctl.recipe.check_judge import check_judge, judge_notes
from rlhfctl.recipe.resolved import resolve
from rlhfctl.rewards.errors import RewardSettingError
from rlhfctl.rewards.judge import (
    DEFAULT_TEMPLATE,
    load_parser,
    parse_error_score_problem,
    parse_verdicts,
    render_prompt,
    score_range_problem,
    template_problem,
)
from tests.rewards import judge_parsers

JUDGE_MODEL = {"config": {"model_type": "qwen2", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                          "num_key_value_heads": 2, "intermediate_size": 64, "max_position_embeddings": 256}}


# ------------------------------------------------------------------ template


def test_template_renders_the_four_placeholders_and_doubled_braces():
    text = render_prompt("Q={prompt} A={response} R={reference} ({rubric}) {{json}}", prompt="2+2", response="4",
                         reference="4", rubric="be exact")
    assert text == "Q=2+2 A=4 R=4 (be exact) {json}"


def test_bundled_template_uses_every_placeholder_and_renders():
    assert template_problem(None) is None
    text = render_prompt(None, prompt="PROMPT", response="RESPONSE", reference="REF", rubric="RUBRIC")
    assert all(part in text for part in ("PROMPT", "RESPONSE", "REF", "RUBRIC")) and text.endswith('"Score: <number>".')
    assert text == DEFAULT_TEMPLATE.format(prompt="PROMPT", response="RESPONSE", reference="REF", rubric="RUBRIC")


@pytest.mark.parametrize(("template", "message"), [
    ("{prompt} {answer}", "unknown placeholder {answer}"),
    ("{prompt} {}", "unknown placeholder {}"),
    ("{0}", "unknown placeholder {0}"),
    ("{prompt.upper}", "unknown placeholder {prompt.upper}"),
    ("{prompt", "expected '}' before end of string"),
    ("json }", "Single '}' encountered"),
])
def test_template_problems_name_the_placeholder_or_the_brace(template, message):
    problem = template_problem(template)
    assert problem is not None and message in problem


# ------------------------------------------------------------------ parsers


@pytest.mark.parametrize(("verdict", "expected"), [
    ("The answer is right. Score: 7", 7.0),
    ("Score: 3.5/10", 3.5),
    ("score = 9", 9.0),
    ("Score: 15, no, I mean 8", 8.0),        # after the mark: the first number in [0, 10]
    ("Step 1 ok, step 2 ok. Score: 2", 2.0),  # numbers before the last mark do not count
    ("Score: 4. Revised score: 6", 6.0),      # the last mark wins
    ("I would give it 4 overall", 4.0),       # no mark: the last number in range
    ("2 errors in 100 lines", 2.0),           # 100 is out of range
    ("Score: eleven", None),
    ("no number here", None),
    ("", None),
])
def test_score_parser(verdict, expected):
    assert load_parser("score", [0, 10])(verdict) == expected


def test_score_parser_takes_its_range():
    parse = load_parser("score", [-1, 1])
    assert parse("Score: -0.5") == -0.5 and parse("Score: 3") is None and parse("-1 or 1?") == 1.0


@pytest.mark.parametrize(("verdict", "expected"), [
    ("Yes, the response is correct.", 5.0), ("no.", -5.0), ("NO: it is wrong", -5.0),
    ("It is correct: yes. Not no.", 5.0), ("nothing to say", None), ("", None),
])
def test_yes_no_parser_reads_the_first_yes_or_no(verdict, expected):
    assert load_parser("yes_no", [-5, 5])(verdict) == expected


def test_user_parser_by_module_and_by_file(tmp_path, monkeypatch):
    assert load_parser("tests.rewards.judge_parsers:first_char", [0, 10]) is judge_parsers.first_char
    (tmp_path / "my_parsers.py").write_text("def length(verdict):\n    return float(len(verdict))\n")
    monkeypatch.chdir(tmp_path)
    assert load_parser("my_parsers.py:length", [0, 10])("abc") == 3.0


@pytest.mark.parametrize(("spec", "message"), [
    ("scores", "'scores' is neither a bundled parser (score, yes_no) nor"),
    ("tests.rewards.judge_parsers:missing", "'tests.rewards.judge_parsers' has no attribute 'missing'"),
    ("no_such_module_x:parse", "cannot load 'no_such_module_x:parse': ModuleNotFoundError"),
    ("missing_file.py:parse", "cannot load 'missing_file.py:parse': FileNotFoundError"),
    ("tests.rewards.judge_parsers:1x", "is malformed"),
])
def test_unloadable_parsers_name_the_key(spec, message):
    with pytest.raises(RewardSettingError) as caught:
        load_parser(spec, [0, 10], "roles.reward.judge.parser")
    assert str(caught.value).startswith("roles.reward.judge.parser: ") and message in str(caught.value)


def test_parse_verdicts_clips_scores_defaults_failures_and_counts_them():
    values = {"a": 12.0, "b": -3.0, "c": None, "d": 4.5, "e": float("nan"), "f": "oops", "g": 7}
    judged = parse_verdicts(list(values), values.get, [0, 10], parse_error_score=1.0)
    assert judged.scores == [10.0, 0.0, 1.0, 4.5, 1.0, 1.0, 7.0]
    assert judged.parse_errors == [False, False, True, False, True, True, False]
    assert judged.parse_error_count == 3 and judged.verdicts == list(values)


def test_a_parser_that_raises_stops_with_its_name_and_the_verdict():
    with pytest.raises(RewardSettingError, match=r"judge.parser 'mine' raised ZeroDivisionError: division by zero on the verdict 'Score: 1'"):
        parse_verdicts(["Score: 1"], judge_parsers.raises, [0, 10], 0.0, "mine")


def test_score_range_and_parse_error_score_problems():
    assert score_range_problem([0, 10]) is None and score_range_problem([-1.5, 2]) is None
    assert score_range_problem([5, 1]) == "must be [min, max] with min < max, got [5, 1]"
    assert score_range_problem([3, 3]) == "must be [min, max] with min < max, got [3, 3]"
    assert score_range_problem([0, float("inf")]).startswith("must be two finite numbers")
    assert parse_error_score_problem([0, 10], 10) is None
    assert parse_error_score_problem([0, 10], -1) == "-1 is outside score_range [0, 10]; pick a score within it"


# ------------------------------------------------------------------ recipe checks


def judge_recipe(*judge: str, pool: str | None = None):
    overrides = [f"roles.reward.judge={{model: {_flow(JUDGE_MODEL)}}}", *(f"roles.reward.judge.{item}" for item in judge)]
    if pool:
        overrides.append(f"roles.reward.pool={pool}")
    return resolve(load_recipe("recipes/quickstart.yaml", overrides))


def _flow(value) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key}: {_flow(item)}" for key, item in value.items()) + "}"
    return str(value)


def test_a_judge_recipe_checks_clean_and_validate_shows_its_prompt():
    recipe = judge_recipe("template='Judge: {prompt} => {response} ({reference}; {rubric})'", "rubric=digits")
    assert check_judge(recipe) == []
    notes = judge_notes(recipe, None, ["digits 1 2:"])
    assert notes == ["judge prompt (roles.reward.judge.template, parser score, score_range [0.0, 10.0]) for the first "
                     "task's example prompt:\n  | Judge: digits 1 2: => <the policy's response> (<the row's ground_truth>; digits)"]
    assert judge_notes(resolve(load_recipe("recipes/quickstart.yaml")), None, ["x"]) == []  # no judge, no note


@pytest.mark.parametrize(("judge", "pool", "key", "message"), [
    (["template='{prompt} {verdict}'"], None, "roles.reward.judge.template", "unknown placeholder {verdict}"),
    (["parser=nowhere:parse"], None, "roles.reward.judge.parser", "cannot load 'nowhere:parse'"),
    (["score_range=[10,0]"], None, "roles.reward.judge.score_range", "must be [min, max] with min < max, got [10.0, 0.0]"),
    (["parse_error_score=11"], None, "roles.reward.judge.parse_error_score", "11.0 is outside score_range"),
    (["model.config=null"], None, "roles.reward.judge.model", "set path"),
    ([], "driver", "roles.reward.pool", "put the reward role on a pool declared in resource_pools"),
])
def test_judge_errors_name_their_key(judge, pool, key, message):
    issues = check_judge(judge_recipe(*judge, pool=pool))
    assert [(issue.key_path, issue.severity) for issue in issues] == [(key, "error")]
    assert issues[0].message.startswith(key) and message in issues[0].message


def test_validate_exits_2_naming_the_judge_key(tmp_path):
    from typer.testing import CliRunner

    from rlhfctl.cli import app

    overrides = [f"roles.reward.judge={{model: {_flow(JUDGE_MODEL)}, template: '{{prompt}} {{answer}}'}}"]
    result = CliRunner().invoke(app, ["validate", "recipes/quickstart.yaml", *overrides])
    assert result.exit_code == 2
    assert "roles.reward.judge.template: unknown placeholder {answer}" in result.output
    assert "Traceback" not in result.output


# ------------------------------------------------------------------ the reward worker with a judge


def _batch(tokenizer) -> DataProto:
    prompts = ["digits 1 2:", "digits 3:", "digits 4 5 6:", "digits 7:"]
    responses = ["12", "x", "", "777"]
    encoded = tokenizer(prompts, padding=True, return_tensors="pt")
    width = 4
    ids = torch.zeros(len(responses), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, text in enumerate(responses):
        tokens = tokenizer(text)["input_ids"]
        ids[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        mask[row, : len(tokens)] = 1
    return DataProto.from_dict(
        tensors={"prompts": encoded["input_ids"], "responses": ids, "response_mask": mask,
                 "attention_mask": torch.cat([encoded["attention_mask"], mask], dim=1)},
        non_tensors={"uid": ["a", "a", "b", "b"], "prompt_text": prompts, "response_text": responses,
                     "ground_truth": ["12", "3", "456", "7"]})


def test_reward_worker_scores_with_the_judge_its_verdicts_parsed():
    from tests.workers.conftest import local_group
    from tests.workers.recipes import tiny_recipe, tokenizer
    from workers import RewardWorker

    judge = {"model": JUDGE_MODEL, "template": "{prompt}|{response}|{reference}|{rubric}>", "rubric": "r",
             "parser": "tests.rewards.judge_parsers:first_char", "max_new_tokens": 6, "score_range": [0.0, 5.0],
             "parse_error_score": 0.5, "batch_size": 3}
    recipe = tiny_recipe(roles={"reward": {"function": "rlhfctl.tasks.digits:score", "judge": judge}})
    batch = _batch(tokenizer())
    with local_group(RewardWorker, recipe, "reward") as group:
        out = group.compute_rewards(batch)
        again = group.compute_rewards(batch)
        worker = group.workers[0]
        assert worker.function is None  # the judge wins over roles.reward.function
        assert not any(parameter.requires_grad for parameter in worker.judge.model.parameters())
    verdicts = out.non_tensor_batch["judge_verdict"].tolist()
    assert len(verdicts) == 4 and all(isinstance(verdict, str) for verdict in verdicts)
    assert verdicts == again.non_tensor_batch["judge_verdict"].tolist()  # temperature 0: greedy, the same verdicts
    parsed = [judge_parsers.first_char(verdict) for verdict in verdicts]
    expected = [0.5 if value is None else min(value, 5.0) for value in parsed]
    assert out.non_tensor_batch["score"].tolist() == expected
    assert out.batch["token_level_scores"].sum(-1).tolist() == expected
    assert out.non_tensor_batch["judge_parse_error"].tolist() == [value is None for value in parsed]
    assert out.meta_info["reward/errors"] == 0


def test_a_judge_is_a_model_so_the_reward_role_may_name_a_strategy():
    from rlhfctl.recipe.check_runtime import check_strategies

    recipe = resolve(load_recipe("recipes/quickstart.yaml", [
        f"roles.reward.judge={{model: {_flow(JUDGE_MODEL)}}}", "roles.reward.strategy=ddp"]))
    assert [issue.key_path for issue in check_strategies(recipe)] == []
    without = resolve(load_recipe("recipes/quickstart.yaml", ["roles.reward.strategy=ddp"]))
    assert [issue.key_path for issue in check_strategies(without)] == ["roles.reward.strategy"]


def test_the_memory_plan_counts_the_judge_as_the_reward_roles_frozen_causal_lm():
    from rlhfctl.recipe.memory_plan import _planned_models

    recipe = judge_recipe()
    [reward] = [model for model in _planned_models(recipe) if model.role == "reward"]
    assert (reward.kind, reward.trainable, dict(reward.model["config"])) == ("causal", False, JUDGE_MODEL["config"])


def test_a_judge_needs_no_reward_function():
    from rlhfctl.recipe.errors import RecipeError

    files = ["~data.task", "data.train_files=[prompts.jsonl]", "roles.reward.function=null"]
    with pytest.raises(RecipeError) as caught:
        load_recipe("recipes/quickstart.yaml", files)
    assert caught.value.key_path == "roles.reward.function"
    cfg = load_recipe("recipes/quickstart.yaml", [*files, f"roles.reward.judge={{model: {_flow(JUDGE_MODEL)}}}"])
    assert cfg.roles.reward.function is None and cfg.roles.reward.judge.parser == "score"
