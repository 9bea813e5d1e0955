"""DAPO's overlong penalty against verl 0.9's DAPORewardManager (fixtures/make_verl_overlong.py), and its checks."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from rlhfctl.algorithms.overlong import overlong_buffer_problem, overlong_penalty

_FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "verl_overlong.json").read_text())
_CASES = _FIXTURE["cases"]


def _case_id(case: dict) -> str:
    return f"max{case['max_new_tokens']}-buf{case['buffer_len']}-x{case['penalty_factor']}-score{case['score']}"


@pytest.mark.parametrize("case", _CASES, ids=_case_id)
def test_score_plus_penalty_at_the_last_token_equals_verls_reward_tensor(case):
    lengths = torch.tensor(case["lengths"])
    penalty = overlong_penalty(lengths, case["max_new_tokens"], case["buffer_len"], case["penalty_factor"])
    assert torch.allclose(penalty, torch.tensor(case["overlong_reward"]), atol=1e-6, rtol=0)
    verl_rewards = torch.tensor(case["reward_tensor"])
    ours = torch.zeros_like(verl_rewards)
    ours[torch.arange(len(lengths)), lengths - 1] = case["score"] + penalty
    assert torch.allclose(ours, verl_rewards, atol=1e-6, rtol=0)


def test_the_fixture_covers_the_buffer_edges():
    assert len(_CASES) >= 20 and _FIXTURE["verl"].startswith("0.9")
    assert any(min(case["overlong_reward"]) < 0 for case in _CASES)
    assert any(case["buffer_len"] == case["max_new_tokens"] for case in _CASES)


def test_hand_computed_values():
    # max 16, buffer 4: expected length 12; 13 tokens exceed it by 1 -> -1/4 * 2.0; the full budget -> -2.0.
    penalty = overlong_penalty(torch.tensor([5, 12, 13, 16]), 16, 4, 2.0)
    assert penalty.tolist() == [0.0, 0.0, -0.5, -2.0]
    assert penalty.dtype == torch.get_default_dtype()


def test_float_lengths_keep_their_dtype():
    penalty = overlong_penalty(torch.tensor([14.0], dtype=torch.float64), 16, 4, 1.0)
    assert penalty.dtype == torch.float64 and penalty.item() == -0.5


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        ({"enable": True, "len": 0}, r"roles.reward.overlong_buffer.len must be > 0 .* got 0"),
        ({"enable": True, "len": -2}, r"roles.reward.overlong_buffer.len must be > 0 .* got -2"),
        ({"enable": True, "len": 9}, r"roles.reward.overlong_buffer.len \(9\) must be <= rollout.max_new_tokens \(8\)"),
    ],
)
def test_an_enabled_buffer_needs_a_length_within_max_new_tokens(cfg, message):
    problem = overlong_buffer_problem(cfg, 8)
    assert problem is not None and re.search(message, problem), problem


@pytest.mark.parametrize("cfg", [{"enable": False, "len": 0}, {"enable": True, "len": 8}, {"enable": True, "len": 1}, {}])
def test_a_disabled_or_fitting_buffer_has_no_problem(cfg):
    assert overlong_buffer_problem(cfg, 8) is None
