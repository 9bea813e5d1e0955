"""On-policy distillation as pure tensor functions: the per-token reverse KL to a teacher and the advantage it gives.

The student samples ``y ~ pi_s``; the teacher scores every sampled token. With ``s_t = log pi_s(y_t | y_<t)`` and
``q_t = log pi_T(y_t | y_<t)``, the single-sample estimate of the reverse KL at token ``t`` is

.. math:: \\mathrm{rkl}_t = s_t - q_t,

whose expectation over ``y_t ~ pi_s`` is ``KL(pi_s || pi_T)`` at that position. Each token's advantage takes
``-coef * rkl_t`` (no discount: the published on-policy distillation recipes score a token by its own gap), beside
``mix`` times the task reward's advantage:

.. math:: A_t = \\mathrm{mix} \\cdot A^{\\text{task}}_t - \\mathrm{coef} \\cdot \\mathrm{rkl}_t,

masked by the response mask. The term is detached: it is a reward, the gradient flows through the policy loss.

With ``whiten`` the reverse KL is first centred and scaled over the batch's response tokens,
``(rkl_t - mean) / std``: the mean is a baseline (on-policy, it leaves the expected gradient as it is), and a
student far from its teacher (every token's gap large and of one sign) is pushed by the differences between
tokens rather than by one shared shift.
"""

from __future__ import annotations

import torch

from .masked import masked_mean

__all__ = ["distillation_advantages", "distillation_metrics", "reverse_kl"]


def reverse_kl(student_log_probs: torch.Tensor, teacher_log_probs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token ``log pi_s - log pi_T`` of the sampled tokens, 0 outside ``mask``: the signal a teacher gives."""
    gap = student_log_probs.detach().float() - teacher_log_probs.detach().float()
    return gap * mask.to(gap.dtype)


def distillation_advantages(task_advantages: torch.Tensor, rkl: torch.Tensor, mask: torch.Tensor,
                            coef: float, mix: float, whiten: bool = False) -> torch.Tensor:
    """``mix * A_task - coef * rkl`` on the response tokens (see the module docstring): the advantage the loss takes;
    with ``whiten`` the reverse KL is first centred and scaled over the batch's response tokens."""
    valid = mask.to(task_advantages.dtype)
    signal = rkl.to(task_advantages.dtype)
    if whiten:
        centred = (signal - masked_mean(signal, valid)) * valid
        signal = centred / (masked_mean(centred ** 2, valid).sqrt() + 1e-6)
    return (float(mix) * task_advantages - float(coef) * signal) * valid


def distillation_metrics(rkl: torch.Tensor, teacher_log_probs: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """``distill/reverse_kl/mean`` and ``distill/teacher_log_prob/mean``, over the response tokens of the batch."""
    return {
        "distill/reverse_kl/mean": float(masked_mean(rkl, mask)),
        "distill/teacher_log_prob/mean": float(masked_mean(teacher_log_probs.float(), mask)),
    }
