"""The probe batch that checks a weight sync: fixed prompt tokens, a few sampled tokens each, scored on both sides.

An engine that took the actor's weights gives its sampled tokens the log-probs the actor gives them;
a missed or garbled weight shows as a mean gap of tenths of a nat. The actor's first vLLM sync and the
``rollout.placement: separate`` channel (``rollout/sync_check_diff``) both use it.
"""

from __future__ import annotations

from typing import Any

import torch

from rlhfctl.protocol import DataProto
from rlhfctl.rollout.generation import SamplingParams

__all__ = ["PROBE_PARAMS", "log_prob_gap", "probe_prompts", "vocab_of"]

_ROWS, _PROMPT = 2, 6
#: 4 tokens sampled at temperature 1 per probe prompt.
PROBE_PARAMS = SamplingParams(n=1, max_new_tokens=4, temperature=1.0, top_p=1.0, top_k=0, do_sample=True)


def probe_prompts(vocab_size: int) -> DataProto:
    """Two fixed prompts of six token ids below ``vocab_size``, unpadded."""
    ids = (torch.arange(_ROWS * _PROMPT).reshape(_ROWS, _PROMPT) * 7 + 3) % int(vocab_size)
    return DataProto.from_dict({"input_ids": ids, "attention_mask": torch.ones_like(ids)})


def log_prob_gap(actor_log_probs: torch.Tensor, probe: DataProto) -> tuple[float, int]:
    """Mean |actor - engine| log-prob over the probe's response tokens, and how many tokens that is."""
    mask = probe.batch["response_mask"].bool()
    gap = (actor_log_probs.float() - probe.batch["rollout_log_probs"].float()).abs()[mask]
    return float(gap.mean()), int(mask.sum())


def vocab_of(tokenizer: Any, config: Any) -> int:
    """The ids both the tokenizer and the model know."""
    return min(int(len(tokenizer)), int(config.vocab_size))
