"""Validation of on-policy distillation (``roles.teacher``, ``algorithm.distillation``) before any worker starts.

A teacher needs a model of its own (a path such as an SFT stage's output, or an inline config): none would be a
random one. Distillation compares the student's and the teacher's log-probs token id by token id, so the teacher's
tokenizer must give every token of the policy's vocabulary the same id; when the two tokenizers differ, this proves
it on the policy's whole vocabulary (the ids it can sample) or refuses, naming both (exit 2).
"""

from __future__ import annotations

from typing import Any

from rlhfctl.recipe.errors import Issue, error, warning
from rlhfctl.recipe.specs import Recipe
from rlhfctl.recipe.schema import DistillationConfig

__all__ = ["check_distillation", "vocabulary_mismatch"]

_SHOWN = 3


def check_distillation(recipe: Recipe) -> list[Issue]:
    """The teacher's model and vocabulary, and an ``algorithm.distillation`` that nothing reads."""
    teacher = recipe.roles.get("teacher")
    if teacher is None:
        settings = recipe.algorithm.distillation
        if (settings.coef, settings.mix) != (DistillationConfig.coef, DistillationConfig.mix):
            return [warning("algorithm.distillation", "algorithm.distillation is set but roles.teacher is not: nothing distills")]
        return []
    written = recipe.section_of("teacher").model
    if not written.path and written.config is None:
        return [error("roles.teacher.model", (
            "roles.teacher.model: set path (e.g. an SFT stage's output: ${stages.sft.output}) or config (an inline "
            "architecture); a teacher without either would be a random model"))]
    issues = _without_reward(recipe) if recipe.roles.get("reward") is None else []
    actor = recipe.roles.get("actor")
    if actor is None or actor.model is None:
        return issues
    problem = _vocabularies(actor.model, teacher.model)
    return issues + ([error("roles.teacher.model", problem)] if problem else [])


def _without_reward(recipe: Recipe) -> list[Issue]:
    """Distillation alone (``roles.reward: null``): what would need a reward is refused, each naming its key."""
    why = "roles.reward is null (distillation alone): "
    issues = []
    if recipe.trainer.val_every:
        issues.append(error("trainer.val_every", f"trainer.val_every: validation scores responses with the reward; {why}"
                                                 "set trainer.val_every: 0 or give roles.reward (it is only logged with mix 0)"))
    if recipe.algorithm.filter_groups.enable:
        issues.append(error("algorithm.filter_groups.enable", f"algorithm.filter_groups keeps groups by their reward; {why}"
                                                               "turn it off or give roles.reward"))
    if recipe.algorithm.adv_estimator == "remax":
        issues.append(error("algorithm.adv_estimator", f"algorithm.adv_estimator: remax scores a greedy baseline with the "
                                                       f"reward; {why}choose another estimator or give roles.reward"))
    return issues


def _vocabularies(student: Any, teacher: Any) -> str | None:
    from rlhfctl.models.loading import load_tokenizer  # transformers: only when a recipe has a teacher

    try:
        student_tokens = load_tokenizer(student, bool(student.trust_remote_code))
        teacher_tokens = load_tokenizer(teacher, bool(teacher.trust_remote_code))
    except Exception as problem:  # noqa: BLE001 - check_models names a tokenizer that does not load
        return f"roles.teacher.model: cannot compare the vocabularies: {problem}"
    mismatch = vocabulary_mismatch(student_tokens.get_vocab(), teacher_tokens.get_vocab())
    if mismatch is None:
        return None
    return (f"roles.teacher.model: the teacher's tokenizer ({_source(teacher)}) and the policy's (roles.actor.model: "
            f"{_source(student)}) do not give the policy's tokens the same ids: {mismatch}. Distillation compares "
            f"log-probs id by id; use a teacher of the policy's tokenizer family")


def vocabulary_mismatch(student: dict[str, int], teacher: dict[str, int]) -> str | None:
    """None when every token of the student's vocabulary has the same id in the teacher's, else what differs."""
    differing = [(token, sid, teacher.get(token)) for token, sid in sorted(student.items(), key=lambda item: item[1])
                 if teacher.get(token) != sid]
    if not differing:
        return None
    shown = ", ".join(f"{token!r} is {sid} vs {'absent' if tid is None else tid}" for token, sid, tid in differing[:_SHOWN])
    return f"{len(differing)} of {len(student)} tokens differ ({shown})"


def _source(model: Any) -> str:
    return str(model.get("tokenizer_path") or model.get("path") or "the inline character tokenizer")
