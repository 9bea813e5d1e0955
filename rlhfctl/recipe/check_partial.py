"""Validation of partial rollouts (``rollout.partial.max_tokens_per_step``).

A sample not finished within a step's token budget continues in the next step on newer weights, so its earlier
tokens are at least one policy version old when it trains (two on a rollout group of its own, whose segments are
generated one version behind): ``trainer.max_staleness`` must be at least that, colocated too, and it bounds the age
of a trained sample's oldest token. A step's generation is one call of every unfinished
sample, continued from its prefix, so the rollouts that shape their own calls (agent turns, dynamic sampling's
extra batches, ReMax's greedy baseline, stream chunks) are refused. Pure: reads the resolved recipe only.
"""

from __future__ import annotations

from rlhfctl.recipe.errors import Issue, error, warning
from rlhfctl.recipe.specs import Recipe

__all__ = ["check_partial", "minimum_staleness"]

KEY = "rollout.partial.max_tokens_per_step"


def minimum_staleness(recipe: Recipe) -> int:
    """The least ``trainer.max_staleness`` under which a carried sample can train: 1 colocated, 2 on a rollout group of
    its own (its segments are generated one version behind the step that trains them)."""
    return 2 if recipe.rollout.on_own_pool else 1


def check_partial(recipe: Recipe) -> list[Issue]:
    """Errors for partial rollouts without room for a carried sample's age or beside a rollout that shapes its calls;
    a warning when the budget carries nothing."""
    rollout = recipe.rollout
    budget = rollout.partial_budget
    if budget is None:
        return []
    prefix = f"{KEY}: {budget}"
    issues = []
    least = minimum_staleness(recipe)
    if rollout.max_staleness < least:
        where = ("on a rollout group of its own, a step's segment is generated while the actor trains the step before "
                 "it, one version behind, so a carried sample trains at least two versions old"
                 if rollout.on_own_pool else "a carried sample trains at least one policy version old")
        issues.append(error(KEY, (
            f"{prefix} carries unfinished samples into the next step, and {where}, but trainer.max_staleness is "
            f"{rollout.max_staleness}: every carried sample would be dropped; set trainer.max_staleness: {least} or "
            "more (the most versions a trained sample's oldest token may lag the actor; older groups are dropped and "
            "counted)")))
    conflicts = [
        (rollout.agent, "rollout.multi_turn.enable", "agent rollouts run turns of their own"),
        (bool(recipe.algorithm.filter_groups.enable), "algorithm.filter_groups.enable",
         "dynamic sampling draws extra batches within a step"),
        (recipe.step.greedy_baseline, "algorithm.adv_estimator", "ReMax's greedy baseline generates each prompt whole"),
        (rollout.on_own_pool and int(rollout.settings.stream_chunks) > 1, "rollout.stream_chunks",
         "a step's segment is one call"),
    ]
    for conflict, key, why in conflicts:
        if conflict:
            issues.append(error(KEY, f"{prefix} cannot be combined with {key} ({why}); turn one of them off"))
    if budget >= rollout.response_width:
        issues.append(warning(KEY, (
            f"{prefix} is not below rollout.max_new_tokens: {rollout.response_width}, so every sample finishes within "
            "its first step and none is ever carried; lower it (e.g. a quarter of max_new_tokens) or set it to null")))
    return issues
