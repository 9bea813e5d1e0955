"""Validation: a token budget (``roles.<role>.micro_batch_tokens``) must hold the longest row.

A PPO row is a prompt plus a response, at most ``data.max_prompt_length + rollout.max_new_tokens``
tokens; an sft row at most ``data.max_length``; a reward_model or dpo row is a pair (chosen and
rejected), at most ``2 x data.max_length``. A smaller budget could never fit that row.
"""

from __future__ import annotations

from typing import Any

from rlhfctl.recipe.report import Issue, error
from rlhfctl.recipe.roles import present_roles

__all__ = ["check_token_budgets", "longest_row"]

_BUDGETED_ROLES = ("actor", "critic", "reward")


def longest_row(cfg: Any) -> tuple[int, str]:
    """The most tokens one training row can hold, and how that follows from the recipe."""
    data, name = cfg.data, str(cfg.algorithm.get("name") or "ppo")
    if name == "sft":
        return int(data.max_length), f"data.max_length {int(data.max_length)}"
    if name in ("reward_model", "dpo"):
        return 2 * int(data.max_length), f"a pair, 2 x data.max_length {int(data.max_length)}"
    prompt, response = int(data.max_prompt_length), int(cfg.rollout.max_new_tokens)
    return prompt + response, f"data.max_prompt_length {prompt} + rollout.max_new_tokens {response}"


def check_token_budgets(cfg: Any) -> list[Issue]:
    """An error per role whose micro_batch_tokens is smaller than the longest row."""
    longest, why = longest_row(cfg)
    issues = []
    for role in present_roles(cfg):
        budget = cfg.roles[role].get("micro_batch_tokens") if role in _BUDGETED_ROLES else None
        if budget is not None and int(budget) < longest:
            key = f"roles.{role}.micro_batch_tokens"
            issues.append(error(key, (
                f"{key}: {int(budget)} is smaller than one sequence ({longest} tokens = {why}); "
                f"set it to at least {longest}, or null to form micro-batches by micro_batch_size rows"
            )))
    return issues
