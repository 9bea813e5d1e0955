"""Whether the actor's update trains on samples of an older policy, and which recipe keys correct for it.

With ``rollout.placement: separate`` and ``trainer.max_staleness: k >= 1`` the rollout group generates up to
``k`` steps ahead of the actor, so a sample may be up to ``k`` policy versions old (``rlhfctl.rollout.staleness``).
The update is then off-policy. Two recipe keys weigh each token by the proximal / behaviour probability, with the
behaviour log-probs the rollout group returns (docs/algorithms.md, "Decoupled PPO and truncated importance
sampling"):

- ``rollout.importance_cap: C``: truncated importance sampling, and ``rollout.importance_mask: [l, h]``: masked
  importance sampling (either or both), with any policy loss that does not take the behaviour log-probs itself
  (:func:`importance_settings`);
- ``roles.actor.policy_loss`` naming a loss that takes them (``decoupled_ppo``; a registered custom one too).

The same keys correct an engine sampling in a precision apart from the actor's (``rollout.dtype``). Validate warns
about staleness without either (:func:`rlhfctl.recipe.check_placement.check_staleness_correction`), and about such a
precision (:func:`rlhfctl.recipe.check_rollout_precision.check_rollout_precision`),
and ``inspect-dispatch`` labels the update with :func:`actor_update_note`. Pure: reads the resolved recipe only.
"""

from __future__ import annotations

from rlhfctl.recipe.specs import Recipe

__all__ = ["CORRECTION_KEYS", "IMPORTANCE_KEYS", "actor_update_note", "importance_settings", "off_policy_corrections",
           "sample_age"]

IMPORTANCE_KEYS = ("importance_cap", "importance_mask")
"""The ``rollout`` keys that weigh each token of the policy loss by the proximal / behaviour ratio (the actor's
``importance_token_weights``); they need the behaviour log-probs and a loss that does not take them itself."""

CORRECTION_KEYS = ("rollout.importance_cap: 2.0 (truncated importance sampling, the policy loss unchanged)",
                   "roles.actor.policy_loss: decoupled_ppo (optionally capped by roles.actor.behav_imp_weight_cap)")
"""The settings that add an off-policy correction, as a message suggests them (the cap is an example value)."""


def sample_age(recipe: Recipe) -> int:
    """The most policy versions a trained sample may lag the actor: ``trainer.max_staleness`` with a rollout group of
    its own (``rollout.placement: separate``) or with partial rollouts (a carried sample's tokens age over the steps it
    continues in), else 0 (the actor's ranks generate on the weights they train)."""
    rollout = recipe.rollout
    return int(rollout.max_staleness) if rollout.on_own_pool or rollout.partial_budget is not None else 0


def importance_settings(recipe: Recipe) -> dict[str, object]:
    """The :data:`IMPORTANCE_KEYS` the recipe sets, by key path (``rollout.importance_cap``) with their values."""
    settings = recipe.rollout.settings
    return {f"rollout.{key}": getattr(settings, key) for key in IMPORTANCE_KEYS if getattr(settings, key) is not None}


def off_policy_corrections(recipe: Recipe) -> list[str]:
    """The recipe's settings that correct the update for the behaviour policy, as ``key: value`` (none: empty)."""
    found = [f"{key}: {_shown(value)}" for key, value in importance_settings(recipe).items()]
    if recipe.step.behaviour_loss:
        found.append(f"roles.actor.policy_loss: {recipe.sections.roles.actor.policy_loss}")
    return found


def _shown(value: object) -> str:
    return f"[{', '.join(str(item) for item in value)}]" if isinstance(value, (list, tuple)) else str(value)


def actor_update_note(recipe: Recipe) -> str:
    """How the actor's update relates to the policy that sampled its batch, for the dataflow's ``update_actor`` note:
    off-policy with the sample age and its correction (or none), else on-policy when no old-log-prob pass is made."""
    detached = "" if recipe.step.needs_old_log_probs else "old log-probs are the detached current ones (no compute_log_prob pass)"
    age = sample_age(recipe)
    if age <= 0:
        return f"on-policy: {detached}" if detached else ""
    corrections = off_policy_corrections(recipe)
    corrected = f"corrected by {' and '.join(corrections)}" if corrections else "no correction"
    label = f"off-policy: samples up to {age} version{'s' if age != 1 else ''} old (trainer.max_staleness), {corrected}"
    return f"{label}; {detached}" if detached else label
