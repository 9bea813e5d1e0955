"""RL algorithms as pure tensor functions: advantage estimators, KL penalties and controllers,
PPO losses, masked statistics.

No I/O and no distribution here: the trainer moves tensors, these functions compute. Importing
this package registers the built-in advantage estimators ("gae", "grpo", "rloo",
"reinforce_plus_plus", "remax"). See ``docs/algorithms.md`` for the formulas and recipe keys.
"""

from .advantages import (
    gae_advantages,
    grpo_advantages,
    reinforce_pp_advantages,
    remax_advantages,
    rloo_advantages,
)
from .kl import (
    KL_KINDS,
    AdaptiveKLController,
    FixedKLController,
    KLController,
    apply_kl_penalty,
    build_kl_controller,
    kl_penalty,
)
from .losses import (
    LOSS_AGG_MODES,
    agg_loss,
    entropy_from_logits,
    ppo_policy_loss,
    token_log_probs,
    truncated_importance_weights,
    value_loss,
)
from .masked import explained_variance, masked_mean, masked_sum, masked_var, masked_whiten
from .registry import (
    ADVANTAGE_ESTIMATORS,
    compute_advantages,
    get_advantage_estimator,
    register_advantage_estimator,
)

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "KL_KINDS",
    "LOSS_AGG_MODES",
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
    "get_advantage_estimator",
    "grpo_advantages",
    "kl_penalty",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "ppo_policy_loss",
    "truncated_importance_weights",
    "register_advantage_estimator",
    "reinforce_pp_advantages",
    "remax_advantages",
    "rloo_advantages",
    "token_log_probs",
    "value_loss",
]
