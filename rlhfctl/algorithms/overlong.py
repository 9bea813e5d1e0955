"""DAPO's soft overlong punishment: a response running into the last ``len`` tokens of its budget loses reward.

DAPO (Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale", arXiv:2503.14476,
section 3.4, "Overlong Reward Shaping") adds a length-aware penalty to the rule-based reward of a response of
``L`` tokens, with a budget ``L_max`` (``rollout.max_new_tokens``) and a buffer of ``L_cache`` tokens::

    penalty = 0                                  if L <= L_max - L_cache
            = ((L_max - L_cache) - L) / L_cache  if L_max - L_cache < L <= L_max
            = -1                                 if L > L_max   (a rollout never exceeds its budget)

scaled by a penalty factor: ``min(-(L - (L_max - L_cache)) / L_cache * factor, 0)``. Source: verl
``verl/workers/reward_manager/dapo.py`` (``DAPORewardManager``), whose ``L`` is the attention mask summed over
the response: the generated tokens up to and including EOS.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["overlong_buffer_problem", "overlong_penalty"]


def overlong_penalty(
    response_lengths: torch.Tensor, max_new_tokens: int, buffer_len: int, penalty_factor: float
) -> torch.Tensor:
    """Per response, ``min(-(L - (max_new_tokens - buffer_len)) / buffer_len * penalty_factor, 0)``.

    ``response_lengths`` (B,) counts each response's valid tokens, EOS included; integer lengths give the
    default float dtype (as verl computes it). 0 for a response that ends before the buffer, falling linearly
    to ``-penalty_factor`` at ``max_new_tokens`` tokens. ``buffer_len`` must be > 0 (see
    :func:`overlong_buffer_problem`).
    """
    lengths = response_lengths if response_lengths.is_floating_point() else response_lengths.to(torch.get_default_dtype())
    expected = max_new_tokens - buffer_len
    return torch.clamp(-(lengths - expected) / buffer_len * penalty_factor, max=0.0)


def overlong_buffer_problem(buffer_cfg: Mapping[str, Any], max_new_tokens: int) -> str | None:
    """Why ``roles.reward.overlong_buffer`` cannot be used with this ``rollout.max_new_tokens``, or None.

    Only an enabled buffer is checked: its ``len`` must be > 0 and <= ``max_new_tokens``.
    """
    if not buffer_cfg.get("enable"):
        return None
    length = buffer_cfg.get("len")
    if not isinstance(length, int) or isinstance(length, bool) or length <= 0:
        return (
            f"roles.reward.overlong_buffer.len must be > 0 when roles.reward.overlong_buffer.enable is true, got "
            f"{length!r}: set it to the number of tokens at the end of rollout.max_new_tokens ({max_new_tokens}) "
            "over which the penalty grows (DAPO uses 4096 of 20480), or set enable: false"
        )
    if length > max_new_tokens:
        return (
            f"roles.reward.overlong_buffer.len ({length}) must be <= rollout.max_new_tokens ({max_new_tokens}): "
            "the buffer is the last len tokens of the response budget; lower len or raise rollout.max_new_tokens"
        )
    return None
