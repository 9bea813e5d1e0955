"""Policy losses by name (``roles.actor.policy_loss``), one call signature, and the keys each one reads.

Every loss is ``fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
token_weights=None) -> (loss, metrics)``: tensors are (batch, response_len); ``config`` is a mapping of the
actor's loss settings (``clip_ratio_low``, ``clip_ratio_high``, ``clip_ratio_c``, ``clip_cov_ratio``, ...,
``loss_scale_factor``); ``token_weights`` (detached, e.g. truncated importance weights) multiply the token
losses. Metrics are 0-dim detached tensors named as verl's without the ``actor/`` prefix. A loss that declares
the keyword ``behaviour_log_prob=None`` also gets the log-probs of the behaviour policy that sampled the tokens
(the engine's ``rollout_log_probs``; None where the actor sampled them itself: the colocated hf engine in its dtype).

Each built-in but ``decoupled_ppo`` (which verl does not have) is numerically equal to the function of the same
name in verl 0.9 ``verl.trainer.ppo.core_algos`` (tests/algorithms/fixtures/make_verl_policy_losses.py). A key
a loss reads is declared once, at registration (``uses=``), so validation can reject a setting the chosen loss
ignores.
A setting left null takes verl's default (the ``_DEFAULTS`` below).
"""

from __future__ import annotations

import inspect
from types import MappingProxyType
from typing import Any, Callable, Mapping, TypeVar

import torch

from .losses import agg_loss, importance_weight_stats, ppo_policy_loss
from .masked import masked_mean

__all__ = [
    "POLICY_LOSSES", "PolicyLossFn", "get_policy_loss", "policy_loss_keys", "policy_loss_takes_behaviour",
    "register_policy_loss",
]

PolicyLossFn = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]
F = TypeVar("F", bound=PolicyLossFn)

_REGISTRY: dict[str, PolicyLossFn] = {}
_USES: dict[str, tuple[str, ...]] = {}
_ROW_MEANS: set[str] = set()  # losses that average over rows whatever loss_agg_mode says
_TAKES_BEHAVIOUR: set[str] = set()  # losses whose signature declares behaviour_log_prob

#: Read-only live view of the registered policy losses, name -> function.
POLICY_LOSSES: Mapping[str, PolicyLossFn] = MappingProxyType(_REGISTRY)

# verl 0.9's defaults (PolicyLossConfig, ActorConfig) for the settings a recipe leaves null.
_DEFAULTS = {
    "clip_cov_ratio": 0.0002, "clip_cov_lb": 1.0, "clip_cov_ub": 5.0,
    "kl_cov_ratio": 0.0002, "ppo_kl_coef": 0.1, "tau_pos": 1.0, "tau_neg": 1.05,
}
_LOG_RATIO_CLAMP = 20.0
_EPS = 1e-8  # verl's masked_mean denominator guard, where it decides a value


def register_policy_loss(name: str, *, uses: tuple[str, ...] = (), averages_rows: bool = False,
                         override: bool = False) -> Callable[[F], F]:
    """Decorator registering a policy loss under ``name``; ``uses`` names the config keys it reads.

    ``averages_rows``: the loss is a mean over rows whatever ``loss_agg_mode`` says (GMPO, SAPO), so
    micro-batches that accumulate it are weighed by their rows, not their tokens.

    A loss whose signature has a ``behaviour_log_prob`` parameter is given the behaviour policy's log-probs
    (read once, here, from the signature: :func:`policy_loss_takes_behaviour`).

    Registering a different function under a taken name raises ``ValueError`` unless ``override=True``.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"policy loss name must be a non-empty string, got {name!r}")

    def decorator(fn: F) -> F:
        existing = _REGISTRY.get(name)
        same = existing is fn or (existing is not None and (existing.__module__, existing.__qualname__) == (fn.__module__, fn.__qualname__))
        if existing is not None and not override and not same:
            raise ValueError(
                f"policy loss {name!r} is already registered to {existing.__module__}.{existing.__qualname__}; "
                "pass override=True to replace it"
            )
        _REGISTRY[name] = fn
        _USES[name] = tuple(uses)
        _ROW_MEANS.discard(name)
        if averages_rows:
            _ROW_MEANS.add(name)
        _TAKES_BEHAVIOUR.discard(name)
        if "behaviour_log_prob" in inspect.signature(fn).parameters:
            _TAKES_BEHAVIOUR.add(name)
        return fn

    return decorator


def get_policy_loss(name: str) -> PolicyLossFn:
    """The loss registered under ``name``; ``ValueError("unknown policy loss 'x'; choose one of: ...")`` otherwise."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown policy loss {name!r}; choose one of: {', '.join(sorted(_REGISTRY))}") from None


def policy_loss_averages_rows(name: str) -> bool:
    """Whether the loss ``name`` is a mean over rows whatever the aggregation (see ``register_policy_loss``)."""
    get_policy_loss(name)
    return name in _ROW_MEANS


def policy_loss_takes_behaviour(name: str) -> bool:
    """Whether the loss ``name`` declares ``behaviour_log_prob`` (the caller passes it, or None without one)."""
    get_policy_loss(name)
    return name in _TAKES_BEHAVIOUR


def policy_loss_keys(name: str) -> tuple[str, ...]:
    """The config keys the loss ``name`` declared it reads."""
    get_policy_loss(name)
    return _USES[name]


def _setting(config: Mapping[str, Any], key: str) -> float:
    value = config.get(key)
    return float(_DEFAULTS[key] if value is None else value)


def _weighted(losses: torch.Tensor, token_weights: torch.Tensor | None) -> torch.Tensor:
    return losses if token_weights is None else losses * token_weights.detach()


def _agg(losses: torch.Tensor, mask: torch.Tensor, agg: str, config: Mapping[str, Any]) -> torch.Tensor:
    return agg_loss(losses, mask, agg, loss_scale_factor=config.get("loss_scale_factor"))


def _verl_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.to(values.dtype)
    return (values * m).sum() / (m.sum() + _EPS)


def _detached(metrics: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {key: value.detach() for key, value in metrics.items()}


@register_policy_loss("vanilla", uses=("clip_ratio_low", "clip_ratio_high", "clip_ratio_c"))
def vanilla(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, token_weights=None):
    """PPO's clipped surrogate with clip-higher and dual clip: :func:`rlhfctl.algorithms.ppo_policy_loss`.

    .. math:: L = \\max(-A\\rho, -A\\operatorname{clip}(\\rho, 1-\\epsilon_{low}, 1+\\epsilon_{high})),
              \\text{ bounded by } -A c \\text{ where } A < 0

    Schulman et al. 2017, arXiv:1707.06347; DAPO arXiv:2503.14476; dual clip arXiv:1912.09729.
    verl: ``compute_policy_loss_vanilla``.
    """
    clip_c = config.get("clip_ratio_c")
    loss, metrics = ppo_policy_loss(
        old_log_prob, log_prob, advantages, response_mask,
        float(config["clip_ratio_low"]), float(config["clip_ratio_high"]),
        float(clip_c) if clip_c is not None else None, loss_agg_mode,
        token_weights=token_weights, loss_scale_factor=config.get("loss_scale_factor"),
    )
    return loss, {"pg_clipfrac": metrics["clipfrac"], "pg_clipfrac_lower": metrics["clipfrac_lower"], "ppo_kl": metrics["ppo_kl"]}


@register_policy_loss("gspo", uses=("clip_ratio_low", "clip_ratio_high"))
def gspo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, token_weights=None):
    """GSPO: the clipped surrogate on a sequence-level ratio (Zheng et al. 2025, arXiv:2507.18071).

    .. math:: \\log s_i = \\frac{1}{|y_i|}\\sum_t m_{i,t}(\\log\\pi - \\log\\pi_{old}),\\quad
              \\log s_{i,t} = \\operatorname{sg}[\\log s_i] + \\log\\pi_{i,t} - \\operatorname{sg}[\\log\\pi_{i,t}]

    :math:`s_{i,t} = \\exp(\\min(\\log s_{i,t}, 10))` (its value is the sequence ratio, its gradient a token's),
    then :math:`L = \\max(-A s, -A\\operatorname{clip}(s, 1-\\epsilon_{low}, 1+\\epsilon_{high}))`. The paper
    reduces with ``seq-mean-token-mean``. verl: ``compute_policy_loss_gspo``.
    """
    m = response_mask.to(log_prob.dtype)
    log_ratio = log_prob - old_log_prob
    seq_log_ratio = (log_ratio * m).sum(-1) / m.sum(-1).clamp(min=1)
    log_s = torch.clamp(log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1), max=10.0)
    ratio = torch.exp(log_s)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - float(config["clip_ratio_low"]), 1 + float(config["clip_ratio_high"]))
    loss = _agg(_weighted(torch.maximum(unclipped, clipped), token_weights), response_mask, loss_agg_mode, config)
    return loss, _detached({
        "pg_clipfrac": _verl_mean((clipped > unclipped).to(m.dtype), m),
        "pg_clipfrac_lower": torch.zeros((), dtype=m.dtype, device=m.device),
        "ppo_kl": _verl_mean(-log_ratio, m),
    })


@register_policy_loss("cispo", uses=("clip_ratio_low", "clip_ratio_high"))
def cispo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, token_weights=None):
    """CISPO: REINFORCE weighted by the clipped, stop-gradient importance ratio (MiniMax-M1, arXiv:2506.13585).

    .. math:: L = -\\operatorname{sg}[\\operatorname{clip}(\\rho, 1-\\epsilon_{low}, 1+\\epsilon_{high})]\\,A\\,\\log\\pi

    with :math:`\\rho = \\exp(\\operatorname{clamp}(\\log\\pi - \\log\\pi_{old}, -20, 20))`: every token keeps a
    gradient, the clip only bounds its weight. ``pg_clipfrac``: fraction where the clip changed the ratio.
    verl: ``compute_policy_loss_cispo``.
    """
    m = response_mask.to(log_prob.dtype)
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-_LOG_RATIO_CLAMP, max=_LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1 - float(config["clip_ratio_low"]), 1 + float(config["clip_ratio_high"]))
    losses = -clipped.detach() * advantages * log_prob
    loss = _agg(_weighted(losses, token_weights), response_mask, loss_agg_mode, config)
    return loss, _detached({
        "pg_clipfrac": _verl_mean((ratio != clipped).to(m.dtype), m),
        "pg_clipfrac_lower": torch.zeros((), dtype=m.dtype, device=m.device),
        "ppo_kl": _verl_mean(-log_ratio, m),
    })


@register_policy_loss("gpg")
def gpg(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, token_weights=None):
    """GPG: plain policy gradient, no ratio and no clip (Chu et al. 2025, arXiv:2504.02546).

    .. math:: L = -A\\,\\log\\pi

    No metrics. verl: ``compute_policy_loss_gpg``.
    """
    return _agg(_weighted(-log_prob * advantages, token_weights), response_mask, loss_agg_mode, config), {}


@register_policy_loss("clip_cov", uses=("clip_ratio_low", "clip_ratio_high", "clip_cov_ratio", "clip_cov_lb", "clip_cov_ub"))
def clip_cov(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, token_weights=None):
    """Clip-Cov: drop the gradient of a few tokens of high covariance (Cui et al. 2025, arXiv:2505.22617).

    .. math:: \\operatorname{cov}_{i,t} = (A_{i,t} - \\bar A)(\\log\\pi_{i,t} - \\overline{\\log\\pi})

    Among valid tokens the PPO clip did not clip, with :math:`lb < \\operatorname{cov} < ub`
    (``clip_cov_lb``, ``clip_cov_ub``), :math:`\\max(1, \\lfloor r N \\rfloor)` picked at random
    (``clip_cov_ratio`` r, N valid tokens; ``torch.randperm`` from the global generator) get weight 0 in
    :math:`L = \\max(-A\\rho, -A\\operatorname{clip}(\\rho, 1-\\epsilon_{low}, 1+\\epsilon_{high}))`
    (:math:`\\rho` unclamped). ``pg_clipfrac``: fraction of tokens dropped. verl: ``compute_policy_loss_clip_cov``.
    """
    ratio_share = _setting(config, "clip_cov_ratio")
    lb, ub = _setting(config, "clip_cov_lb"), _setting(config, "clip_cov_ub")
    if not ratio_share > 0:
        raise ValueError(f"clip_cov_ratio must be > 0, got {ratio_share}")
    m = response_mask.to(log_prob.dtype)
    valid = m > 0
    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - float(config["clip_ratio_low"]), 1 + float(config["clip_ratio_high"]))
    with torch.no_grad():
        cov = (advantages - _verl_mean(advantages, m)) * (log_prob - _verl_mean(log_prob, m))
        cov = cov.masked_fill(~valid | ((clipped > unclipped) & valid), -torch.inf)
        candidates = torch.nonzero((cov < ub) & (cov > lb) & valid)
        chosen = max(int(ratio_share * m.sum().item()), 1)
        if len(candidates) > 0:
            candidates = candidates[torch.randperm(len(candidates))[: min(chosen, len(candidates))]]
        keep = torch.ones_like(advantages)
        keep[candidates[:, 0], candidates[:, 1]] = 0
    losses = torch.maximum(unclipped, clipped) * keep
    loss = _agg(_weighted(losses, token_weights), response_mask, loss_agg_mode, config)
    return loss, _detached({"pg_clipfrac": _verl_mean((keep == 0).to(m.dtype), m), "ppo_kl": _verl_mean(-log_ratio, m)})


@register_policy_loss("kl_cov", uses=("kl_cov_ratio", "ppo_kl_coef"))
def kl_cov(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, token_weights=None):
    """KL-Cov: a KL penalty on the tokens of highest covariance (Cui et al. 2025, arXiv:2505.22617).

    .. math:: L_{i,t} = -A\\rho + [\\,(i,t) \\in \\text{top-}k\\,]\\;\\beta\\,\\lvert\\log\\pi - \\log\\pi_{old}\\rvert

    with :math:`\\rho = \\exp(\\log\\pi - \\log\\pi_{old})` (no clip), the top :math:`k = \\max(1, \\lfloor r N \\rfloor)`
    valid tokens by :math:`(A - \\bar A)(\\log\\pi - \\overline{\\log\\pi})` (``kl_cov_ratio`` r; means over valid
    tokens), :math:`\\beta` = ``ppo_kl_coef``. ``ppo_kl``: mean of :math:`\\lvert\\log\\pi - \\log\\pi_{old}\\rvert`.
    verl: ``compute_policy_loss_kl_cov``.
    """
    ratio_share, coef = _setting(config, "kl_cov_ratio"), _setting(config, "ppo_kl_coef")
    if not ratio_share > 0:
        raise ValueError(f"kl_cov_ratio must be > 0, got {ratio_share}")
    m = response_mask.to(log_prob.dtype)
    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(log_ratio)
    base = -advantages * ratio
    with torch.no_grad():
        valid = (m > 0).reshape(-1)
        flat_valid = torch.nonzero(valid, as_tuple=True)[0]
        adv, logp = advantages.detach().reshape(-1)[valid].cpu(), log_prob.detach().reshape(-1)[valid].cpu()
        penalised = torch.zeros(m.numel(), dtype=torch.bool)
        if len(adv) > 0:
            cov = (adv - adv.mean()) * (logp - logp.mean())
            top = torch.topk(cov, max(1, int(len(cov) * ratio_share)), largest=True).indices
            penalised[flat_valid.cpu()[top]] = True
        penalised = penalised.reshape(m.shape).to(m.device)
    losses = torch.where(penalised, base + coef * log_ratio.abs(), base)
    loss = _agg(_weighted(losses, token_weights), response_mask, loss_agg_mode, config)
    return loss, _detached({"ppo_kl": _verl_mean(log_ratio.abs(), m)})


@register_policy_loss("geo_mean", uses=("clip_ratio_low", "clip_ratio_high"), averages_rows=True)
def geo_mean(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, token_weights=None):
    """GMPO: the geometric mean of the token ratios, clipped per token in log space (Zhao et al. 2025,
    arXiv:2507.20673).

    .. math:: \\ell_{i,t} = \\operatorname{sgn}(A)\\min\\big(\\operatorname{sgn}(A)\\,d,\\;
              \\operatorname{sgn}(A)\\operatorname{clamp}(d, -\\epsilon_{low}, \\epsilon_{high})\\big),\\quad d = \\log\\pi - \\log\\pi_{old}

    .. math:: L_i = -\\bar A_i \\exp\\Big(\\frac{\\sum_t m\\,\\ell}{\\sum_t m + 10^{-8}}\\Big),\\qquad L = \\frac1B\\sum_i L_i

    (:math:`\\bar A_i` the token mean of the advantages). ``loss_agg_mode`` is not used; token weights enter as
    their per-sequence geometric mean. verl: ``compute_policy_loss_geo_mean``.
    """
    m = response_mask.to(log_prob.dtype)
    low, high = float(config["clip_ratio_low"]), float(config["clip_ratio_high"])
    log_ratio = log_prob - old_log_prob
    sign = torch.sign(advantages)
    clamped = torch.clamp(log_ratio, -low, high)
    token_terms = sign * torch.min(sign * log_ratio, sign * clamped)
    lengths = m.sum(-1) + _EPS
    ratio = torch.exp((token_terms * m).sum(-1) / lengths)
    losses = -((advantages * m).sum(-1) / lengths) * ratio
    if token_weights is not None:
        losses = losses * torch.exp((torch.log(token_weights.detach() + 1e-10) * m).sum(-1) / lengths)
    was_clipped = (log_ratio != clamped).to(m.dtype)
    return losses.mean(), _detached({
        "pg_clipfrac": _verl_mean(was_clipped * (advantages > 0), m),
        "pg_clipfrac_lower": _verl_mean(was_clipped * (advantages < 0), m),
        "ppo_kl": _verl_mean(-log_ratio, m),
    })


@register_policy_loss("sapo", uses=("tau_pos", "tau_neg"), averages_rows=True)
def sapo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, token_weights=None):
    """SAPO: a smooth sigmoid gate in place of the hard clip (Gao et al. 2025, arXiv:2511.20347).

    .. math:: f_\\tau(\\rho) = \\frac{4}{\\tau}\\,\\sigma(\\tau(\\rho - 1)),\\qquad L = -f_{\\tau}(\\rho)\\,A,\\qquad
              \\tau = \\tau_{pos} \\text{ if } A > 0 \\text{ else } \\tau_{neg}

    with :math:`\\rho = \\exp(\\operatorname{clamp}(\\log\\pi - \\log\\pi_{old}, -20, 20))` (the gate's gradient is
    :math:`\\sigma'` times 4, 1 at :math:`\\rho = 1`). Always reduced with ``seq-mean-token-mean``, whatever
    ``loss_agg_mode`` says, as verl. verl: ``compute_policy_loss_sapo``.
    """
    m = response_mask.to(log_prob.dtype)
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-_LOG_RATIO_CLAMP, max=_LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    tau_pos = torch.as_tensor(_setting(config, "tau_pos"), dtype=advantages.dtype, device=advantages.device)
    tau_neg = torch.as_tensor(_setting(config, "tau_neg"), dtype=advantages.dtype, device=advantages.device)
    taus = torch.where(advantages > 0, tau_pos, tau_neg)
    gates = torch.sigmoid(taus * (ratio - 1.0)) * (4.0 / taus)
    loss = _agg(_weighted(-gates * advantages, token_weights), response_mask, "seq-mean-token-mean", config)
    zero = torch.zeros((), dtype=m.dtype, device=m.device)
    return loss, _detached({"pg_clipfrac": zero, "pg_clipfrac_lower": zero, "ppo_kl": _verl_mean(-log_ratio, m)})


@register_policy_loss("decoupled_ppo", uses=("clip_ratio_low", "clip_ratio_high", "behav_imp_weight_cap"))
def decoupled_ppo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, token_weights=None,
                  behaviour_log_prob=None):
    """Decoupled PPO: the clip is around the proximal policy, and a separate weight corrects for the behaviour policy
    that sampled (Hilton et al. 2022, "Batch size-invariance for policy optimization", arXiv:2110.00641; the
    objective AReaL trains asynchronously with, Fu et al. 2025, arXiv:2505.24298).

    .. math:: w = \\operatorname{sg}\\Big[\\frac{\\pi_{prox}}{\\pi_{behav}}\\Big],\\quad r = \\frac{\\pi_\\theta}{\\pi_{prox}},\\quad
              L = -w\\,\\min\\big(rA,\\; \\operatorname{clip}(r, 1-\\epsilon_{low}, 1+\\epsilon_{high})A\\big)

    :math:`\\pi_{behav}` is ``behaviour_log_prob`` (the engine's log-probs of the sampled tokens),
    :math:`\\pi_{prox}` is ``old_log_prob`` (the actor's, recomputed before the update), :math:`\\pi_\\theta` is
    ``log_prob``. Without ``behaviour_log_prob`` (the hf engine samples with the actor itself) :math:`w = 1` and this
    is ``vanilla`` without the dual clip. With ``behav_imp_weight_cap`` C, a token with :math:`w > C` gets
    :math:`w = 0`: it leaves the sum but still counts in the ``loss_agg_mode`` denominator, as AReaL's
    ``ppo_actor_loss_fn`` (``areal/utils/functional.py``: ``behav_mask = behav_imp_weight <= cap``, the loss
    summed over the mask divided by all valid tokens). Both log-ratios are clamped to [-20, 20] before ``exp``,
    as ``vanilla``. Metrics: ``pg_clipfrac``, ``ppo_kl`` (:math:`\\log\\pi_{prox} - \\log\\pi_\\theta`) and
    :func:`rlhfctl.algorithms.losses.importance_weight_stats` of :math:`w`. verl 0.9 has no loss of this name.
    """
    cap = config.get("behav_imp_weight_cap")
    if cap is not None and not float(cap) > 1.0:
        raise ValueError(f"behav_imp_weight_cap must be > 1 (null: no cap), got {cap}")
    m = response_mask.to(log_prob.dtype)
    proximal = old_log_prob.detach()
    behaviour = proximal if behaviour_log_prob is None else behaviour_log_prob.detach().to(proximal.dtype)
    weights = torch.exp(torch.clamp(proximal - behaviour, min=-_LOG_RATIO_CLAMP, max=_LOG_RATIO_CLAMP))
    if cap is not None:
        weights = torch.where(weights <= float(cap), weights, torch.zeros_like(weights))
    log_ratio = torch.clamp(log_prob - proximal, min=-_LOG_RATIO_CLAMP, max=_LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - float(config["clip_ratio_low"]), 1 + float(config["clip_ratio_high"]))
    losses = torch.maximum(unclipped, clipped) * weights
    loss = _agg(_weighted(losses, token_weights), response_mask, loss_agg_mode, config)
    return loss, _detached({
        "pg_clipfrac": masked_mean((clipped > unclipped).to(m.dtype), m),
        "ppo_kl": masked_mean(-log_ratio, m),
        **importance_weight_stats(proximal, behaviour, response_mask, None if cap is None else float(cap)),
    })
