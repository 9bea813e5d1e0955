"""A custom policy loss that takes the behaviour policy's log-probs, registered on import (algorithm.import_modules)."""

from __future__ import annotations

from rlhfctl.algorithms.policy_losses import get_policy_loss, register_policy_loss


@register_policy_loss("test_behaviour_weighted", uses=("clip_ratio_low", "clip_ratio_high"), override=True)
def behaviour_weighted(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, token_weights=None,
                       behaviour_log_prob=None):
    """The vanilla loss; it declares behaviour_log_prob, so the actor hands it the engine's log-probs."""
    return get_policy_loss("vanilla")(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                                      token_weights=token_weights)
