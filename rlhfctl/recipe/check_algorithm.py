"""Validation: the advantage estimator exists and has what it needs; KL has a reference; sampling is sane."""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from rlhfctl.recipe.errors import did_you_mean
from rlhfctl.recipe.importing import ensure_cwd_importable
from rlhfctl.recipe.report import Issue, error, warning
from rlhfctl.recipe.roles import reference_source, uses_kl

__all__ = ["check_algorithm"]


def check_algorithm(cfg: Any) -> list[Issue]:
    """Errors and warnings about algorithm.*, the roles it needs, and rollout sampling."""
    issues = _import_modules(cfg)
    issues += _estimator(cfg)
    issues += _kl(cfg)
    issues += _sampling(cfg)
    return issues


def _import_modules(cfg: Any) -> list[Issue]:
    ensure_cwd_importable()
    issues = []
    for index, name in enumerate(cfg.algorithm.import_modules):
        key = f"algorithm.import_modules[{index}]"
        try:
            importlib.import_module(str(name))
        except (Exception, SystemExit) as failure:  # user code may fail in any way at import time
            detail = str(failure).splitlines()[0] if str(failure) else ""
            issues.append(error(key, f"{key}: cannot import {name!r}: {type(failure).__name__}: {detail}"))
    return issues


def _estimator(cfg: Any) -> list[Issue]:
    from rlhfctl.algorithms import ADVANTAGE_ESTIMATORS

    name = str(cfg.algorithm.adv_estimator)
    key = "algorithm.adv_estimator"
    if name not in ADVANTAGE_ESTIMATORS:
        known = sorted(ADVANTAGE_ESTIMATORS)
        return [error(key, (
            f"{key}: {name!r} is not one of: {', '.join(known)}{did_you_mean(name, known)} "
            "(custom estimators: register them in a module listed in algorithm.import_modules)"
        ))]
    params = inspect.signature(ADVANTAGE_ESTIMATORS[name]).parameters
    has_critic = cfg.roles.get("critic") is not None
    issues = []
    values = params.get("values")
    if values is not None and values.default is inspect.Parameter.empty and not has_critic:
        issues.append(error(key, f"{key}: {name} needs value estimates: add a critic role (roles.critic)"))
    if has_critic and values is None and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        issues.append(warning("roles.critic", f"roles.critic: the critic is trained but {name} does not use values; use gae or remove the critic"))
    if "index" in params and int(cfg.rollout.n) == 1:
        issues.append(warning("rollout.n", f"rollout.n: 1 response per prompt gives {name} groups of one (no baseline); use n >= 2"))
    return issues


def _kl(cfg: Any) -> list[Issue]:
    kl = cfg.algorithm.kl
    issues = []
    if uses_kl(cfg) and reference_source(cfg) is None:
        key = "algorithm.kl.use_kl_loss" if kl.use_kl_loss else "algorithm.kl.use_in_reward"
        issues.append(error(key, f"{key}: the KL term needs a reference policy: set roles.reference (or give the actor a LoRA adapter)"))
    if cfg.roles.get("reference") is not None and not uses_kl(cfg):
        issues.append(warning("roles.reference", (
            "roles.reference: reference log-probs are computed every step but no KL term uses them; "
            "set algorithm.kl.use_kl_loss or use_in_reward, or roles.reference=null"
        )))
    if kl.controller == "adaptive" and not kl.use_in_reward:
        issues.append(warning("algorithm.kl.controller", "algorithm.kl.controller: the adaptive controller only scales the in-reward KL (use_in_reward is false)"))
    return issues


def _sampling(cfg: Any) -> list[Issue]:
    rollout = cfg.rollout
    issues = []
    if rollout.do_sample and rollout.temperature == 0:
        issues.append(error("rollout.temperature", "rollout.temperature: 0 with do_sample true; for greedy decoding set rollout.do_sample=false"))
    if not rollout.do_sample and rollout.n > 1:
        issues.append(warning("rollout.do_sample", (
            f"rollout.do_sample: greedy decoding makes the {rollout.n} responses of a prompt identical (zero group advantages)"
        )))
    return issues
