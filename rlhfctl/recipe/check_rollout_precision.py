"""Validation of ``rollout.dtype``: an engine sampling in a precision apart from the actor's compute dtype.

The engine's behaviour policy is then not the one the actor scores (a bf16 engine and a float32 actor differ in
every token's log-prob), so the update is slightly off-policy. The same recipe keys that correct for a stale
rollout correct for it (:mod:`rlhfctl.recipe.off_policy`); without either, validate warns. Pure: reads the
resolved recipe only.
"""

from __future__ import annotations

from rlhfctl.recipe.errors import Issue, warning
from rlhfctl.recipe.off_policy import CORRECTION_KEYS, off_policy_corrections
from rlhfctl.recipe.specs import Recipe

__all__ = ["check_rollout_precision"]


def check_rollout_precision(recipe: Recipe) -> list[Issue]:
    """A warning when ``rollout.dtype`` differs from ``roles.actor.model.dtype`` and no off-policy correction is set."""
    rollout = recipe.rollout
    if not rollout.own_precision or off_policy_corrections(recipe):
        return []
    actor = recipe.sections.roles.actor.model.dtype
    return [warning("rollout.dtype", (
        f"rollout.dtype: {rollout.dtype} differs from roles.actor.model.dtype: {actor}, so the engine samples from a "
        "slightly different policy than the one the actor scores and trains, and no off-policy correction is set; "
        f"add one: {' or '.join(CORRECTION_KEYS)}; or set rollout.dtype: null (the actor's dtype). "
        "rollout/logprob_diff logs the gap each step"))]
