"""Validation of the importance-sampling corrections for the rollout engine's behaviour log-probs
(``rollout.importance_cap``, truncated IS, and ``rollout.importance_mask``, masked IS; docs/algorithms.md,
"Decoupled PPO and truncated importance sampling"): the band's order, the policy losses that take the behaviour
log-probs themselves, and a rollout that returns none."""

from __future__ import annotations

from rlhfctl.recipe.errors import Issue, error, warning
from rlhfctl.recipe.off_policy import importance_settings
from rlhfctl.recipe.specs import Recipe

__all__ = ["check_importance_correction"]

_WHAT = {"rollout.importance_cap": "truncated importance sampling", "rollout.importance_mask": "masked importance sampling"}


def check_importance_correction(recipe: Recipe) -> list[Issue]:
    """Errors for a ``rollout.importance_mask`` band out of order and for either key beside a policy loss that takes
    the behaviour log-probs (it would weigh each token twice); a warning for either key where the rollout returns no
    behaviour log-probs (the colocated hf actor), where it has no effect."""
    settings = importance_settings(recipe)
    issues = _band(recipe)
    loss = _behaviour_loss(recipe)
    for key in settings:
        if loss is not None:
            issues.append(error(key, (
                f"{key}: policy_loss {loss} takes the behaviour log-probs and weighs each token by proximal / "
                f"behaviour probability already; {_WHAT[key]} would weigh it twice. Remove it (decoupled_ppo caps the "
                "weight with roles.actor.behav_imp_weight_cap) or use another policy loss"
            )))
        elif not recipe.rollout.engine_log_probs:
            issues.append(warning(key, f"{key}: has no effect with rollout.engine: hf "
                                       "(the actor samples and scores with the same weights and code)"))
    return issues


def _band(recipe: Recipe) -> list[Issue]:
    band = recipe.rollout.settings.importance_mask
    if band is None or len(band) != 2 or float(band[0]) < float(band[1]):  # the length and low >= 0: field checks
        return []
    low, high = band
    return [error("rollout.importance_mask", (
        f"rollout.importance_mask: [low, high] needs low < high, got [{low}, {high}]; tokens whose ratio "
        "exp(old - engine log-prob) leaves the band are masked, e.g. [0.5, 2.0]"
    ))]


def _behaviour_loss(recipe: Recipe) -> str | None:
    """The actor's policy loss when it takes the behaviour log-probs itself, else None (unregistered: check_algorithm).

    The actor's own rule (``policy_loss_takes_behaviour``), so a custom loss that takes them is refused here as it
    would be at its first update. Not ``recipe.step.behaviour_loss``: that is decided when the recipe is resolved,
    before check_algorithm imports ``algorithm.import_modules`` and a custom loss registers."""
    from rlhfctl.algorithms import POLICY_LOSSES  # the loss registry pulls in torch: only when the check runs
    from rlhfctl.algorithms.policy_losses import policy_loss_takes_behaviour

    actor = recipe.sections.roles.actor
    name = None if actor is None else str(actor.policy_loss)
    return name if name in POLICY_LOSSES and policy_loss_takes_behaviour(name) else None
