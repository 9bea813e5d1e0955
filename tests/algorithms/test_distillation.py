"""On-policy distillation's math on fixed logits: the per-token reverse KL and the advantage it gives, by hand."""

from __future__ import annotations

import math

import pytest
import torch

from rlhfctl.algorithms.distillation import distillation_advantages, distillation_metrics, reverse_kl
from rlhfctl.recipe.check_distillation import vocabulary_mismatch

# Two response positions over a vocabulary of three; the student sampled token 0, then token 1; a third, padded position.
STUDENT_LOGITS = torch.tensor([[[2.0, 1.0, 0.0], [0.0, 0.0, 0.0], [5.0, 0.0, 0.0]]])
TEACHER_LOGITS = torch.tensor([[[0.0, 1.0, 2.0], [1.0, 0.0, 0.0], [0.0, 0.0, 5.0]]])
SAMPLED = torch.tensor([[0, 1, 2]])
MASK = torch.tensor([[1, 1, 0]])
SECOND = math.log((math.e + 2) / 3)  # the second position by hand: -log 3 (uniform student) + log(e + 2)


def _sampled_log_probs(logits: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits, dim=-1).gather(-1, SAMPLED.unsqueeze(-1)).squeeze(-1)


def test_the_reverse_kl_of_each_sampled_token_equals_the_hand_computed_one():
    z = math.log(math.e ** 2 + math.e + 1)  # both first rows share this normalizer
    first = (2 - z) - (0 - z)  # log p_s(0) - log p_T(0) = 2 exactly
    second = -math.log(3) - (0 - math.log(math.e + 2))  # uniform student; teacher puts e on token 0
    rkl = reverse_kl(_sampled_log_probs(STUDENT_LOGITS), _sampled_log_probs(TEACHER_LOGITS), MASK)
    assert rkl.shape == (1, 3)
    assert rkl[0, 0].item() == pytest.approx(2.0, abs=1e-6) == pytest.approx(first, abs=1e-6)
    assert rkl[0, 1].item() == pytest.approx(second, abs=1e-6) == pytest.approx(0.452832, abs=1e-6)
    assert rkl[0, 2].item() == 0.0  # padding carries no signal


def test_the_advantage_is_mix_times_the_tasks_minus_coef_times_the_reverse_kl():
    rkl = reverse_kl(_sampled_log_probs(STUDENT_LOGITS), _sampled_log_probs(TEACHER_LOGITS), MASK)
    task = torch.tensor([[0.5, 0.5, 0.5]])
    mixed = distillation_advantages(task, rkl, MASK, coef=0.5, mix=2.0)
    assert mixed[0].tolist() == pytest.approx([2 * 0.5 - 0.5 * 2.0, 2 * 0.5 - 0.5 * SECOND, 0.0], abs=1e-6)
    alone = distillation_advantages(task, rkl, MASK, coef=1.0, mix=0.0)
    assert alone[0].tolist() == pytest.approx([-2.0, -SECOND, 0.0], abs=1e-6)


def test_a_teacher_equal_to_the_student_gives_no_signal_and_the_metrics_average_the_response_tokens():
    same = _sampled_log_probs(STUDENT_LOGITS)
    assert reverse_kl(same, same, MASK).abs().max().item() == 0.0
    teacher = _sampled_log_probs(TEACHER_LOGITS)
    rkl = reverse_kl(same, teacher, MASK)
    metrics = distillation_metrics(rkl, teacher, MASK)
    assert metrics["distill/reverse_kl/mean"] == pytest.approx((2.0 + SECOND) / 2, abs=1e-6)
    expected_teacher = ((0 - math.log(math.e ** 2 + math.e + 1)) + (0 - math.log(math.e + 2))) / 2
    assert metrics["distill/teacher_log_prob/mean"] == pytest.approx(expected_teacher, abs=1e-6)


def test_vocabularies_match_when_every_student_token_has_its_id_in_the_teacher():
    assert vocabulary_mismatch({"a": 0, "b": 1}, {"a": 0, "b": 1, "c": 2}) is None  # a teacher may know more tokens
    problem = vocabulary_mismatch({"a": 0, "b": 1, "d": 2}, {"a": 0, "b": 2})
    assert problem == "2 of 3 tokens differ ('b' is 1 vs 2, 'd' is 2 vs absent)"


def test_whitening_centres_and_scales_the_reverse_kl_over_the_response_tokens():
    rkl = reverse_kl(_sampled_log_probs(STUDENT_LOGITS), _sampled_log_probs(TEACHER_LOGITS), MASK)
    # Two valid tokens, 2 and SECOND: centred they are +-(2 - SECOND)/2, which is also their root mean square.
    whitened = distillation_advantages(torch.zeros(1, 3), rkl, MASK, coef=0.5, mix=0.0, whiten=True)
    assert whitened[0].tolist() == pytest.approx([-0.5, 0.5, 0.0], abs=1e-5)
    task = torch.tensor([[0.5, 0.5, 0.5]])
    mixed = distillation_advantages(task, rkl, MASK, coef=1.0, mix=1.0, whiten=True)
    assert mixed[0].tolist() == pytest.approx([0.5 - 1.0, 0.5 + 1.0, 0.0], abs=1e-5)
