"""Actor and critic losses: clipped PPO policy loss, clipped value loss, entropy, aggregation.

Loss matrices are (batch, response_len), reduced to a scalar by :func:`agg_loss`. Metrics are
returned as 0-dim detached tensors (no host sync inside the loss; call ``.item()`` when
logging). Numerics follow verl ``core_algos`` (``compute_policy_loss``,
``compute_value_loss``, ``agg_loss``) and ``verl.utils.torch_functional.entropy_from_logits``.
"""

from __future__ import annotations

import torch

from rlhfctl.algorithms.choices import LOSS_AGG_MODES

from .masked import masked_mean

__all__ = [
    "LOSS_AGG_MODES",
    "agg_loss",
    "entropy_from_logits",
    "importance_token_weights",
    "importance_weight_stats",
    "masked_importance_weights",
    "ppo_policy_loss",
    "token_log_probs",
    "value_loss",
]

#: Accepted values of ``roles.actor.loss_agg_mode``.

# log-ratio clamp before exp, as verl: keeps the ratio finite for badly stale samples.
_LOG_RATIO_CLAMP = 20.0


def agg_loss(loss_mat: torch.Tensor, mask: torch.Tensor, agg: str, loss_scale_factor: float | None = None) -> torch.Tensor:
    """Reduce a (batch, response_len) loss matrix over valid tokens to a scalar.

    - ``token-mean``: :math:`\\sum_{i,t} m_{i,t} L_{i,t} / \\sum_{i,t} m_{i,t}` (every token
      weighs the same; DAPO, arXiv:2503.14476)
    - ``seq-mean-token-sum``: :math:`\\frac1B \\sum_i \\sum_t m_{i,t} L_{i,t}` (Dr. GRPO style)
    - ``seq-mean-token-mean``: :math:`\\frac1B \\sum_i \\frac{\\sum_t m_{i,t} L_{i,t}}{\\sum_t m_{i,t}}`
      (every sequence weighs the same; original GRPO). A row with no valid token contributes 0
      and still counts in B.
    - ``seq-mean-token-sum-norm``: :math:`\\frac{1}{B\\,T} \\sum_i \\sum_t m_{i,t} L_{i,t}` with the constant
      T = ``loss_scale_factor``, or the padded response length ``mask.shape[-1]`` when None (Dr. GRPO,
      arXiv:2503.20783: a constant in place of each sequence's length, so no length bias).

    A row with no valid token counts in B (verl 0.9 leaves such rows out of B in the ``seq-mean-*`` modes;
    the same for any batch whose rows each have a valid token). An empty mask gives 0. Unknown ``agg`` raises ``ValueError`` listing the choices.
    Source: verl ``core_algos.agg_loss``.
    """
    m = mask.to(loss_mat.dtype)
    if agg == "token-mean":
        return masked_mean(loss_mat, m)
    if agg == "seq-mean-token-sum":
        return (loss_mat * m).sum(dim=-1).mean()
    if agg == "seq-mean-token-sum-norm":
        scale = float(loss_scale_factor) if loss_scale_factor is not None else float(mask.shape[-1])
        return (loss_mat * m).sum(dim=-1).mean() / scale
    if agg == "seq-mean-token-mean":
        return ((loss_mat * m).sum(dim=-1) / m.sum(dim=-1).clamp_min(1.0)).mean()
    raise ValueError(f"unknown loss aggregation mode {agg!r}; choose one of: {', '.join(LOSS_AGG_MODES)}")


def ppo_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    clip_ratio_c: float | None,
    agg: str,
    token_weights: torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped surrogate PPO loss (Schulman et al. 2017, arXiv:1707.06347) with asymmetric
    clipping (DAPO "clip-higher", arXiv:2503.14476) and dual clip (Ye et al. 2020,
    arXiv:1912.09729).

    With :math:`\\rho = \\exp(\\operatorname{clamp}(\\log\\pi - \\log\\pi_{old}, -20, 20))`:

    .. math::
        L^{clip} = \\max\\big(-A\\rho,\\; -A\\,\\operatorname{clip}(\\rho, 1-\\epsilon_{low}, 1+\\epsilon_{high})\\big)

        L = \\begin{cases} \\min(L^{clip}, -A\\,c) & A < 0 \\\\ L^{clip} & A \\ge 0 \\end{cases}

    The dual clip bounds the loss of a negative-advantage token whose ratio has exploded;
    ``clip_ratio_c`` (c) must be > 1, or None to disable it. ``L`` (times ``token_weights`` when
    given, e.g. :func:`truncated_importance_weights`) is reduced with :func:`agg_loss`.

    Metrics (0-dim detached tensors, masked means over valid tokens):

    - ``clipfrac``: fraction of tokens where the clipped branch is larger (it won the max),
    - ``clipfrac_lower``: fraction of tokens with A < 0 where the dual clip is active
      (:math:`L^{clip} > -A c`),
    - ``approx_kl``: k3 estimator of KL(pi_old || pi), :math:`(\\rho - 1) - \\log\\rho`
      (always >= 0; CleanRL's ``approx_kl``),
    - ``ppo_kl``: k1 estimator, mean of :math:`\\log\\pi_{old} - \\log\\pi` (verl's ``ppo_kl``).

    Source: verl ``core_algos.compute_policy_loss``; CleanRL ``ppo.py``.
    """
    if clip_ratio_c is not None and not clip_ratio_c > 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 for the dual clip (or None to disable it), got {clip_ratio_c}")
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"clip ratios must be >= 0, got clip_low={clip_low}, clip_high={clip_high}")
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-_LOG_RATIO_CLAMP, max=_LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)

    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    clip_loss = torch.maximum(unclipped, clipped)
    negative = advantages < 0
    if clip_ratio_c is not None:
        dual_bound = -advantages * clip_ratio_c
        pg_losses = torch.where(negative, torch.minimum(clip_loss, dual_bound), clip_loss)
        dual_active = (clip_loss > dual_bound) & negative
    else:
        pg_losses = clip_loss
        dual_active = torch.zeros_like(negative)
    if token_weights is not None:
        pg_losses = pg_losses * token_weights.detach()
    loss = agg_loss(pg_losses, response_mask, agg, loss_scale_factor)

    with torch.no_grad():
        lr = log_ratio.detach()
        metrics = {
            "clipfrac": masked_mean((clipped > unclipped).float(), response_mask),
            "clipfrac_lower": masked_mean(dual_active.float(), response_mask),
            "approx_kl": masked_mean(torch.expm1(lr) - lr, response_mask),
            "ppo_kl": masked_mean(-lr, response_mask),
        }
    return loss, {k: v.detach() for k, v in metrics.items()}


def truncated_importance_weights(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, cap: float) -> torch.Tensor:
    """Truncated importance sampling for a rollout engine whose log-probs differ from the trainer's
    (Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL training"):

    .. math::
        w = \\min\\big(\\exp(\\log\\pi_{old} - \\log\\pi_{engine}),\\; C\\big)

    detached, multiplied into each token's policy loss. Source: verl ``tis_imp_ratio_cap``.
    """
    if not cap > 0:
        raise ValueError(f"the importance cap must be > 0, got {cap}")
    log_ratio = torch.clamp(old_log_prob - rollout_log_prob, min=-_LOG_RATIO_CLAMP, max=_LOG_RATIO_CLAMP)
    return torch.exp(log_ratio).clamp(max=cap).detach()


def masked_importance_weights(
    old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, low: float, high: float
) -> torch.Tensor:
    """Token-level masked importance sampling (MIS), for a rollout engine whose log-probs differ from the trainer's
    (Liu, Li et al. 2025, "When Speed Kills Stability: Demystifying RL Collapse from the Training-Inference
    Mismatch", token-level MIS; verl ``rollout_rs: token`` keeps the same band):

    .. math::
        w = \\mathbb{1}\\big[\\,l \\le \\exp(\\log\\pi_{old} - \\log\\pi_{engine}) \\le h\\,\\big]

    detached 0/1 weights: a token whose ratio leaves ``[low, high]`` drops out of the policy loss's sum (it keeps
    its place in the denominator, as ``decoupled_ppo``'s ``behav_imp_weight_cap``); the others keep weight 1.
    The log-ratio is clamped to [-20, 20] first, as in :func:`truncated_importance_weights`.
    """
    if not 0 <= low < high:
        raise ValueError(f"the importance mask needs 0 <= low < high, got [{low}, {high}]")
    log_ratio = torch.clamp(old_log_prob - rollout_log_prob, min=-_LOG_RATIO_CLAMP, max=_LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio.detach())
    return ((ratio >= low) & (ratio <= high)).to(ratio.dtype)


def importance_token_weights(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    cap: float | None = None,
    band: tuple[float, float] | None = None,
) -> torch.Tensor | None:
    """The policy loss's per-token weights of ``rollout.importance_cap`` and ``rollout.importance_mask`` (one rule for
    both): :func:`truncated_importance_weights` times :func:`masked_importance_weights`, either alone, or None when
    neither is set. With both, a token inside the band keeps :math:`\\min(\\rho, C)` and one outside gets 0."""
    weights = None
    if cap is not None:
        weights = truncated_importance_weights(old_log_prob, rollout_log_prob, float(cap))
    if band is not None:
        kept = masked_importance_weights(old_log_prob, rollout_log_prob, float(band[0]), float(band[1]))
        weights = kept if weights is None else weights * kept
    return weights


def importance_weight_stats(
    proximal_log_prob: torch.Tensor,
    behaviour_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    cap: float | None = None,
    band: tuple[float, float] | None = None,
) -> dict[str, torch.Tensor]:
    """Statistics of the behaviour importance weights over valid tokens, before any cap or mask:

    .. math:: w = \\exp(\\operatorname{clamp}(\\log\\pi_{prox} - \\log\\pi_{behav}, -20, 20))

    ``behav_imp_weight/mean``, ``/max``, ``/min`` of :math:`w`; ``/capped_fraction``: the share of valid
    tokens with :math:`w > C` (those :func:`truncated_importance_weights` truncates and ``decoupled_ppo``'s
    ``behav_imp_weight_cap`` masks; 0 without a cap); with ``band`` = (l, h), ``/masked_fraction``: the share of
    valid tokens outside :math:`[l, h]` (those :func:`masked_importance_weights` masks). 0-dim detached tensors;
    an empty mask gives 0 for each.
    """
    with torch.no_grad():
        valid = response_mask.to(torch.bool)
        log_ratio = torch.clamp(proximal_log_prob - behaviour_log_prob, min=-_LOG_RATIO_CLAMP, max=_LOG_RATIO_CLAMP)
        weights = torch.exp(log_ratio.detach())
        zero = weights.new_zeros(())
        some = valid.any()
        capped = weights > cap if cap is not None else torch.zeros_like(valid)
        stats = {
            "behav_imp_weight/mean": masked_mean(weights, valid),
            "behav_imp_weight/max": torch.where(some, weights.masked_fill(~valid, -torch.inf).amax(), zero),
            "behav_imp_weight/min": torch.where(some, weights.masked_fill(~valid, torch.inf).amin(), zero),
            "behav_imp_weight/capped_fraction": masked_mean(capped.to(weights.dtype), valid),
        }
        if band is not None:
            outside = (weights < band[0]) | (weights > band[1])
            stats["behav_imp_weight/masked_fraction"] = masked_mean(outside.to(weights.dtype), valid)
        return stats


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    clip_range: float | None,
    agg: str,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped value loss (PPO2 baselines; Andrychowicz et al. 2021, arXiv:2006.05990, sec. 3.2).

    .. math::
        V^{clip} = \\operatorname{clip}(V, V_{old} - c, V_{old} + c), \\qquad
        L = \\tfrac12 \\max\\big((V - R)^2, (V^{clip} - R)^2\\big)

    reduced with :func:`agg_loss`. ``clip_range=None`` disables clipping (plain
    :math:`\\tfrac12 (V - R)^2`). Metrics: ``vf_clipfrac`` (fraction of valid tokens where the
    clipped term is larger) and ``vpred_mean`` (0-dim detached tensors).
    Source: verl ``core_algos.compute_value_loss``.
    """
    unclipped = (values - returns) ** 2
    if clip_range is None:
        losses = unclipped
        clipped_won = torch.zeros_like(unclipped, dtype=torch.bool)
    else:
        if clip_range < 0:
            raise ValueError(f"clip_range must be >= 0, got {clip_range}")
        v_clipped = torch.clamp(values, old_values - clip_range, old_values + clip_range)
        clipped = (v_clipped - returns) ** 2
        losses = torch.maximum(unclipped, clipped)
        clipped_won = clipped > unclipped
    loss = 0.5 * agg_loss(losses, response_mask, agg)
    with torch.no_grad():
        metrics = {
            "vf_clipfrac": masked_mean(clipped_won.float(), response_mask),
            "vpred_mean": masked_mean(values.detach(), response_mask),
        }
    return loss, {k: v.detach() for k, v in metrics.items()}


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the categorical distribution over the last dimension of ``logits``.

    .. math:: H = \\log\\sum_j e^{z_j} - \\sum_j \\operatorname{softmax}(z)_j\\, z_j

    (equal to :math:`-\\sum_j p_j \\log p_j`, computed stably). Shape: ``logits.shape[:-1]``.
    Source: verl ``torch_functional.entropy_from_logits``.
    """
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def token_log_probs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = True,
    entropy_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of ``targets`` under ``softmax(logits / temperature)`` in float32, and its entropy (or None).

    .. math:: \\log \\pi(y) = z_y / T - \\log\\sum_j e^{z_j / T}

    ``logits`` (..., V) and ``targets`` (...,) of token ids; a temperature of 0 or 1 leaves the logits as
    they are (the rollout sampled from ``softmax(logits / T)``). With ``entropy_grad=False`` the entropy is
    computed from detached logits (a metric, no graph kept for it). Works row by row, so a caller may pass
    the tokens of a sequence in chunks and get the same values.
    """
    logits = logits.float()
    if temperature and temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    log_probs = torch.log_softmax(logits, dim=-1).gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)
    entropy = None
    if with_entropy:
        entropy = entropy_from_logits(logits if entropy_grad else logits.detach())
    return log_probs, entropy
