"""RL algorithms as pure tensor functions: advantage estimators, KL penalties and controllers,
PPO losses and the policy-loss registry, masked statistics.

No I/O and no distribution here: the trainer moves tensors, these functions compute. The built-in
advantage estimators ("gae", "grpo", "rloo", "reinforce_plus_plus", "remax" in ``advantages``; "grpo_passk",
"opo", "gpg", "gdpo" in ``group_estimators``) register when the registry is first imported. The names are
imported on first use, so that ``choices`` (the names a recipe may give, read by the schema checks) loads
without torch. See ``docs/algorithms.md`` for the formulas and recipe keys.
"""

from __future__ import annotations

from rlhfctl.lazy_exports import lazy_exports

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "KL_KINDS",
    "LOSS_AGG_MODES",
    "POLICY_LOSSES",
    "AdaptiveKLController",
    "FixedKLController",
    "KLController",
    "agg_loss",
    "apply_kl_penalty",
    "build_kl_controller",
    "compute_advantages",
    "entropy_from_logits",
    "explained_variance",
    "gae_advantages",
    "gdpo_advantages",
    "get_advantage_estimator",
    "get_policy_loss",
    "gpg_advantages",
    "grpo_advantages",
    "grpo_passk_advantages",
    "kl_penalty",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "opo_advantages",
    "ppo_policy_loss",
    "truncated_importance_weights",
    "masked_importance_weights",
    "importance_token_weights",
    "register_advantage_estimator",
    "register_policy_loss",
    "reinforce_pp_advantages",
    "remax_advantages",
    "rloo_advantages",
    "token_log_probs",
    "value_loss",
]

_LAZY = {
    "ADVANTAGE_ESTIMATORS": "rlhfctl.algorithms.registry",
    "KL_KINDS": "rlhfctl.algorithms.choices",
    "LOSS_AGG_MODES": "rlhfctl.algorithms.choices",
    "POLICY_LOSSES": "rlhfctl.algorithms.policy_losses",
    "AdaptiveKLController": "rlhfctl.algorithms.kl",
    "FixedKLController": "rlhfctl.algorithms.kl",
    "KLController": "rlhfctl.algorithms.kl",
    "agg_loss": "rlhfctl.algorithms.losses",
    "apply_kl_penalty": "rlhfctl.algorithms.kl",
    "build_kl_controller": "rlhfctl.algorithms.kl",
    "compute_advantages": "rlhfctl.algorithms.registry",
    "entropy_from_logits": "rlhfctl.algorithms.losses",
    "explained_variance": "rlhfctl.algorithms.masked",
    "gae_advantages": "rlhfctl.algorithms.advantages",
    "gdpo_advantages": "rlhfctl.algorithms.group_estimators",
    "get_advantage_estimator": "rlhfctl.algorithms.registry",
    "get_policy_loss": "rlhfctl.algorithms.policy_losses",
    "gpg_advantages": "rlhfctl.algorithms.group_estimators",
    "grpo_advantages": "rlhfctl.algorithms.advantages",
    "grpo_passk_advantages": "rlhfctl.algorithms.group_estimators",
    "kl_penalty": "rlhfctl.algorithms.kl",
    "masked_mean": "rlhfctl.algorithms.masked",
    "masked_sum": "rlhfctl.algorithms.masked",
    "masked_var": "rlhfctl.algorithms.masked",
    "masked_whiten": "rlhfctl.algorithms.masked",
    "opo_advantages": "rlhfctl.algorithms.group_estimators",
    "ppo_policy_loss": "rlhfctl.algorithms.losses",
    "truncated_importance_weights": "rlhfctl.algorithms.losses",
    "masked_importance_weights": "rlhfctl.algorithms.losses",
    "importance_token_weights": "rlhfctl.algorithms.losses",
    "register_advantage_estimator": "rlhfctl.algorithms.registry",
    "register_policy_loss": "rlhfctl.algorithms.policy_losses",
    "reinforce_pp_advantages": "rlhfctl.algorithms.advantages",
    "remax_advantages": "rlhfctl.algorithms.advantages",
    "rloo_advantages": "rlhfctl.algorithms.advantages",
    "token_log_probs": "rlhfctl.algorithms.losses",
    "value_loss": "rlhfctl.algorithms.losses",
}

__getattr__ = lazy_exports(__name__, _LAZY)
