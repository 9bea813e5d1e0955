"""Name -> function registry of advantage estimators, and one uniform way to call them.

A recipe names its estimator with ``algorithm.adv_estimator``; the trainer resolves it with
:func:`get_advantage_estimator` or, more simply, calls :func:`compute_advantages`, which reads
the estimator's signature and passes only the inputs it declares. A custom estimator is a
function registered with ``@register_advantage_estimator("my_est")`` whose parameters are
named after the keyword arguments of :func:`compute_advantages`.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

# The built-in estimators register themselves in the table when imported; importing them here makes any use of the
# registry see them (the package's names are imported lazily).
from rlhfctl.algorithms import advantages as _builtin_estimators  # noqa: F401
from rlhfctl.algorithms import group_estimators as _group_estimators  # noqa: F401
from rlhfctl.algorithms.estimator_table import _REGISTRY, ADVANTAGE_ESTIMATORS, AdvantageFn, register_advantage_estimator

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AdvantageFn",
    "compute_advantages",
    "get_advantage_estimator",
    "register_advantage_estimator",
]

# Why an input can be missing, shown when an estimator needs it and the trainer passed None.
_MISSING_HINTS = {
    "values": "configure a critic role",
    "index": "the batch must carry one group id (uid) per response, shared by the responses of one prompt",
    "reward_baselines": "score a greedy rollout per prompt to use as the baseline (ReMax)",
    "named_scores": "the reward function must return a dict of named scores, one per name in algorithm.gdpo_reward_keys (GDPO)",
}



def get_advantage_estimator(name: str) -> AdvantageFn:
    """Return the estimator registered under ``name``.

    Raises ``ValueError("unknown advantage estimator 'x'; choose one of: ...")`` otherwise.
    """
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        choices = ", ".join(sorted(_REGISTRY))
        raise ValueError(f"unknown advantage estimator {name!r}; choose one of: {choices}") from None


def compute_advantages(
    name: str,
    *,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    values: torch.Tensor | None = None,
    index: Any = None,
    reward_baselines: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_by_std: bool = True,
    **extra: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Call the estimator ``name`` with the inputs it declares; return ``(advantages, returns)``.

    Inputs are matched to the estimator's parameters by name. A parameter the estimator
    requires (no default) whose input is None raises ``ValueError``, e.g.
    ``"advantage estimator 'gae' needs values: configure a critic role"``. Inputs the estimator
    does not declare are ignored (``gamma`` for GRPO, ``values`` for RLOO, ...), so the trainer
    can always pass everything it has. ``extra`` keyword inputs are forwarded the same way, for
    custom estimators with parameters of their own; an estimator with ``**kwargs`` receives all
    inputs that are not None.
    """
    fn = get_advantage_estimator(name)
    available: dict[str, Any] = {
        "token_level_rewards": token_level_rewards,
        "response_mask": response_mask,
        "values": values,
        "index": index,
        "reward_baselines": reward_baselines,
        "gamma": gamma,
        "lam": lam,
        "norm_by_std": norm_by_std,
        **extra,
    }
    params = inspect.signature(fn).parameters
    takes_var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    kwargs: dict[str, Any] = {}
    for pname, param in params.items():
        if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            continue
        value = available.get(pname)
        if value is not None:
            if param.kind is inspect.Parameter.POSITIONAL_ONLY:
                raise TypeError(f"advantage estimator {name!r}: parameter {pname!r} must not be positional-only")
            kwargs[pname] = value
        elif param.default is inspect.Parameter.empty:
            hint = _MISSING_HINTS.get(pname, "compute_advantages was not given it")
            raise ValueError(f"advantage estimator {name!r} needs {pname}: {hint}")
    if takes_var_kw:
        for key, value in available.items():
            if key not in params and value is not None:
                kwargs[key] = value
    return fn(**kwargs)
