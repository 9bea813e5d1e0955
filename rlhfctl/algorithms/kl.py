"""Per-token KL estimators between the policy and the reference model, and KL coefficient
controllers.

The estimators follow John Schulman, "Approximating KL Divergence" (2020,
http://joschu.net/blog/kl-approx.html): with samples from the policy pi and the log-ratio
``x = log pi(a) - log ref(a)``, k1 = x is unbiased but high-variance, k2 = x^2/2 is biased but
low-variance, k3 = (e^{-x} - 1) + x is unbiased and always >= 0. Source: verl ``kl_penalty``.

The controllers scale the in-reward KL penalty ``r_t - beta * kl_t`` (Ziegler et al. 2019,
"Fine-Tuning Language Models from Human Preferences", arXiv:1909.08593).
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from rlhfctl.algorithms.choices import KL_KINDS

from .masked import masked_mean

__all__ = [
    "KL_KINDS",
    "AdaptiveKLController",
    "FixedKLController",
    "KLController",
    "apply_kl_penalty",
    "build_kl_controller",
    "kl_penalty",
]

#: Canonical estimator names.
_KL_ALIASES = {"kl": "k1", "mse": "k2", "low_var_kl": "k3"}


def _canonical_kind(kind: str) -> str:
    canonical = _KL_ALIASES.get(kind, kind)
    if canonical not in KL_KINDS:
        aliases = ", ".join(f"{a}->{c}" for a, c in _KL_ALIASES.items())
        raise ValueError(
            f"unknown KL penalty kind {kind!r}; choose one of: {', '.join(KL_KINDS)} (aliases: {aliases})"
        )
    return canonical


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL(pi || ref) estimate from log-probs of the sampled tokens (same shape out).

    - ``k1`` (alias ``kl``): :math:`\\log\\pi - \\log\\pi_{ref}`
    - ``k2`` (alias ``mse``): :math:`\\tfrac12(\\log\\pi - \\log\\pi_{ref})^2`
    - ``k3`` (alias ``low_var_kl``): :math:`e^{d} - d - 1` with
      :math:`d = \\log\\pi_{ref} - \\log\\pi`, clamped to [0, 10] (``d`` is first clamped to
      [-20, 20] so ``exp`` cannot overflow; this never changes the clamped result). The value is never
      negative in exact arithmetic; the lower bound 0 (verl uses -10) removes float32 rounding below
      zero at ``d`` near 0, where the gradient is 0 anyway
    - ``abs``: :math:`|\\log\\pi - \\log\\pi_{ref}|`

    Unknown ``kind`` raises ``ValueError`` listing the choices. Differentiable in ``logprob``
    (used as a loss with ``algorithm.kl.use_kl_loss``). Source: Schulman 2020; verl
    ``core_algos.kl_penalty``.
    """
    kind = _canonical_kind(kind)
    if kind == "k1":
        return logprob - ref_logprob
    if kind == "k2":
        return 0.5 * (logprob - ref_logprob).square()
    if kind == "abs":
        return (logprob - ref_logprob).abs()
    d = torch.clamp(ref_logprob - logprob, min=-20.0, max=20.0)
    return torch.clamp(torch.exp(d) - d - 1.0, min=0.0, max=10.0)


@torch.no_grad()
def apply_kl_penalty(
    token_level_scores: torch.Tensor,
    logprob: torch.Tensor,
    ref_logprob: torch.Tensor,
    response_mask: torch.Tensor,
    coef: float,
    kind: str = "k1",
) -> tuple[torch.Tensor, torch.Tensor]:
    """In-reward KL penalty: ``token_level_rewards = scores - coef * kl * mask``.

    .. math:: r_t = s_t - \\beta\\, \\mathrm{KL}_t\\, m_t

    Returns ``(token_level_rewards, current_kl)`` where ``current_kl`` (0-dim tensor) is the
    batch mean of the per-sequence token-mean KL, the quantity to feed
    ``controller.update(current_kl.item(), n_steps=batch_size)``. Source: verl
    ``ray_trainer.apply_kl_penalty``; Ziegler et al. 2019.
    """
    mask = response_mask.to(token_level_scores.dtype)
    kld = kl_penalty(logprob, ref_logprob, kind).to(token_level_scores.dtype) * mask
    rewards = token_level_scores - coef * kld
    current_kl = masked_mean(kld, mask, dim=-1).mean()
    return rewards, current_kl


class KLController:
    """Interface of a KL coefficient controller: ``.value`` and ``.update(kl, n_steps)``."""

    value: float

    def update(self, current_kl: float, n_steps: int) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:  # pragma: no cover - interface
        raise NotImplementedError

    def load_state_dict(self, state: Mapping[str, Any]) -> None:  # pragma: no cover - interface
        raise NotImplementedError


class FixedKLController(KLController):
    """Constant KL coefficient: ``update`` is a no-op."""

    def __init__(self, coef: float) -> None:
        self.value = float(coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Leave the coefficient unchanged."""

    def state_dict(self) -> dict[str, Any]:
        return {"kind": "fixed", "value": self.value}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.value = float(state["value"])

    def __repr__(self) -> str:
        return f"FixedKLController(coef={self.value})"


class AdaptiveKLController(KLController):
    """Adaptive KL coefficient (Ziegler et al. 2019, arXiv:1909.08593, section 2.2).

    After each batch with observed KL ``current_kl`` over ``n_steps`` samples:

    .. math:: e = \\operatorname{clip}\\Big(\\frac{\\mathrm{KL}}{\\mathrm{target}} - 1, -0.2, 0.2\\Big),
              \\qquad \\beta \\leftarrow \\beta\\,\\Big(1 + e\\,\\frac{n\\_steps}{\\mathrm{horizon}}\\Big)

    so beta grows when the KL is above target and shrinks below it, by at most 20% per
    horizon. Source: verl ``AdaptiveKLController`` (from lm-human-preferences).
    """

    def __init__(self, init_coef: float, target: float, horizon: float) -> None:
        if target <= 0:
            raise ValueError(f"AdaptiveKLController target must be > 0, got {target}")
        if horizon <= 0:
            raise ValueError(f"AdaptiveKLController horizon must be > 0, got {horizon}")
        self.value = float(init_coef)
        self.target = float(target)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Apply one proportional update of the coefficient (see the class docstring)."""
        error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon

    def state_dict(self) -> dict[str, Any]:
        return {"kind": "adaptive", "value": self.value, "target": self.target, "horizon": self.horizon}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.value = float(state["value"])
        self.target = float(state.get("target", self.target))
        self.horizon = float(state.get("horizon", self.horizon))

    def __repr__(self) -> str:
        return f"AdaptiveKLController(value={self.value}, target={self.target}, horizon={self.horizon})"


def build_kl_controller(
    controller: str, coef: float, target: float | None = None, horizon: float | None = None
) -> KLController:
    """Build the controller named by ``algorithm.kl.controller`` (``fixed`` or ``adaptive``).

    ``adaptive`` needs ``target`` and ``horizon`` (``algorithm.kl.target`` / ``.horizon``).
    """
    if controller == "fixed":
        return FixedKLController(coef)
    if controller == "adaptive":
        if target is None or horizon is None:
            raise ValueError("adaptive KL controller needs algorithm.kl.target and algorithm.kl.horizon")
        return AdaptiveKLController(coef, target, horizon)
    raise ValueError(f"unknown KL controller {controller!r}; choose one of: fixed, adaptive")
