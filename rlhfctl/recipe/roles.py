"""What each role must provide, and which roles a recipe actually uses."""

from __future__ import annotations

from typing import Any

from rlhfctl.recipe.resolve import present_roles, reference_source
from rlhfctl.recipe.schema import ROLE_NAMES

__all__ = ["ROLE_METHODS", "ROLE_NAMES", "present_roles", "reference_source", "required_methods", "uses_kl"]

#: Registered methods the trainer calls on each role's worker group.
ROLE_METHODS: dict[str, tuple[str, ...]] = {
    "actor": ("init_model", "generate_sequences", "compute_log_prob", "update_actor"),
    "reference": ("compute_ref_log_prob",),
    "critic": ("init_model", "compute_values", "update_critic"),
    "reward": ("compute_rewards",),
}


def uses_kl(cfg: Any) -> bool:
    """True when the KL to the reference enters the reward or the loss."""
    kl = cfg.algorithm.kl
    return bool(kl.use_in_reward or kl.use_kl_loss)


def required_methods(cfg: Any, role: str) -> tuple[str, ...]:
    """Registered methods ``role``'s worker class needs for this recipe (the actor also serves as reference with LoRA)."""
    methods = ROLE_METHODS[role]
    if role == "actor" and reference_source(cfg) == "actor":
        methods = (*methods, "compute_ref_log_prob")
    return methods
