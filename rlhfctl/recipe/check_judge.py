"""``roles.reward.judge`` before a run: the template renders, the parser loads, the score range is a range, the judge
model has a source and a pool to run on; and the judge prompt ``rlhfctl validate`` shows beside the example prompt."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlhfctl.recipe.errors import Issue, error
from rlhfctl.recipe.pools import DRIVER_POOL
from rlhfctl.recipe.specs import Recipe
from rlhfctl.rewards.errors import RewardSettingError
from rlhfctl.rewards.judge import (
    load_parser,
    parse_error_score_problem,
    render_prompt,
    score_range_problem,
    template_problem,
)

__all__ = ["JUDGE_KEY", "check_judge", "judge_notes"]

JUDGE_KEY = "roles.reward.judge"

_SHOWN_CHARACTERS = 1200
_PLACEHOLDER_RESPONSE = "<the policy's response>"
_PLACEHOLDER_REFERENCE = "<the row's ground_truth>"


def _judge(recipe: Recipe) -> Any:
    """The judge section, or None when the recipe has no reward role or no judge."""
    spec = recipe.roles.get("reward")
    return None if spec is None else spec.settings.get("judge")


def check_judge(recipe: Recipe) -> list[Issue]:
    """Errors (exit 2) naming ``roles.reward.judge.<key>``: a template with an unknown placeholder, a parser that does
    not load, a score_range out of order (or parse_error_score outside it), a judge model without path or config, the
    judge in the driver process, and a judge beside ``roles.reward.remote``."""
    judge = _judge(recipe)
    if judge is None:
        return []
    issues: list[Issue] = []
    problem = template_problem(judge.template)
    if problem:
        issues.append(error(f"{JUDGE_KEY}.template", f"{JUDGE_KEY}.template: {problem}"))
    range_problem = score_range_problem(judge.score_range)
    if range_problem:
        issues.append(error(f"{JUDGE_KEY}.score_range", f"{JUDGE_KEY}.score_range: {range_problem}"))
    else:
        bound = parse_error_score_problem(judge.score_range, judge.parse_error_score)
        if bound:
            issues.append(error(f"{JUDGE_KEY}.parse_error_score", f"{JUDGE_KEY}.parse_error_score: {bound}"))
        try:
            load_parser(str(judge.parser), list(judge.score_range), f"{JUDGE_KEY}.parser")
        except RewardSettingError as failure:
            issues.append(error(f"{JUDGE_KEY}.parser", str(failure)))
    model = judge.model
    if not (model.get("path") or model.get("config")):
        issues.append(error(f"{JUDGE_KEY}.model", (
            f"{JUDGE_KEY}.model: set path (a causal LM checkpoint, e.g. an instruct model) or config (an inline "
            "architecture with random weights, for tests)")))
    reward = recipe.roles["reward"]
    if reward.pool == DRIVER_POOL:
        issues.append(error("roles.reward.pool", (
            f"roles.reward.pool: {DRIVER_POOL} runs a reward function in the driver process, but {JUDGE_KEY} is a "
            "model: put the reward role on a pool declared in resource_pools")))
    if reward.settings.get("remote"):
        issues.append(error(JUDGE_KEY, (
            f"{JUDGE_KEY}: roles.reward.remote is set too; one scorer per reward role: remove one of them")))
    return issues


def judge_notes(recipe: Recipe, example_text: str | None, task_examples: Sequence[str] = ()) -> list[str]:
    """The judge prompt of the example prompt (validate's, else the first task's), for a placeholder response and
    reference; empty without a judge or with a template that does not render (check_judge says why)."""
    judge = _judge(recipe)
    if judge is None or template_problem(judge.template):
        return []
    prompt, source = example_text, "the example prompt"
    if prompt is None and task_examples:
        prompt, source = task_examples[0], "the first task's example prompt"
    if prompt is None:
        prompt, source = "<the prompt>", "a placeholder prompt"
    text = render_prompt(judge.template, prompt=prompt, response=_PLACEHOLDER_RESPONSE,
                         reference=_PLACEHOLDER_REFERENCE, rubric=str(judge.rubric))
    shown = text if len(text) <= _SHOWN_CHARACTERS else text[:_SHOWN_CHARACTERS] + f" ... ({len(text) - _SHOWN_CHARACTERS} more characters)"
    which = "the bundled template" if judge.template is None else f"{JUDGE_KEY}.template"
    lines = "\n".join(f"  | {line}" for line in shown.split("\n"))
    return [f"judge prompt ({which}, parser {judge.parser}, score_range {list(judge.score_range)}) for {source}:\n{lines}"]
