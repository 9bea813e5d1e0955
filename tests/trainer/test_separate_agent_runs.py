"""Agent rollouts (``rollout.multi_turn``) on a rollout group of its own: the tools run in the rollout processes.

At k = 0 the run is the colocated agent run, step for step: the same trajectories (tool calls included),
rewards and losses. At k = 1 the agent trajectories of the next step are generated during the update.
"""

from __future__ import annotations

import json

import pytest

from tests.trainer.test_separate_rollout_runs import COMPARED, SEPARATE
from tests.trainer.test_training_runs import train

ECHO = "{class: 'tests.agents.test_agent_loop:EchoTool', config: {sleep_s: 0.01}}"
AGENT = [(f"rollout.multi_turn={{enable: true, max_turns: 3, max_response_tokens: 48, max_tool_response_tokens: 16, "
          f"format: test_always_echo, tools: [{ECHO}]}}")]
RUN = ["rollout.n=2", "rollout.max_new_tokens=8", "trainer.batch_size=4", "trainer.mini_batch_size=4",
       "data.num_train=16", "trainer.total_steps=2", "trainer.log_samples=4", "trainer.trace=true"]
AGENT_KEYS = ("agent/turns/mean", "agent/tool_calls/mean", "agent/tool_errors/mean", "agent/truncated_fraction")


def _span_names(output_dir) -> set[str]:
    return {event["name"] for event in json.loads((output_dir / "trace.json").read_text())["traceEvents"]}


def test_agent_rollouts_on_a_rollout_group_are_the_colocated_actors_at_k0_and_run_ahead_at_k1(ray_session, tmp_path):
    colocated = train("quickstart.yaml", tmp_path / "colocated", *RUN, *AGENT)
    separate = train("quickstart.yaml", tmp_path / "separate", *RUN, *AGENT, *SEPARATE, "rollout.sync_check_every=1")
    assert separate[-1]["agent/tool_calls/mean"] > 0
    for key in (*COMPARED, *AGENT_KEYS):
        assert [r[key] for r in separate] == [r[key] for r in colocated], key
    assert all(r["rollout/sync_check_diff"] < 1e-5 for r in separate)
    samples = [json.loads(line) for line in (tmp_path / "separate" / "samples.jsonl").read_text().splitlines()]
    assert any(message["role"] == "tool" for sample in samples for message in sample["messages"])
    assert {"rollout.agent.generate", "rollout.agent.tool.echo"} <= _span_names(tmp_path / "separate")
    assert not any(name.startswith("actor.agent") for name in _span_names(tmp_path / "separate"))

    # One version behind, corrected by the engine's log-probs of the policy's tokens (tool outputs are masked out).
    ahead = train("quickstart.yaml", tmp_path / "ahead", *RUN, *AGENT, *SEPARATE, "trainer.max_staleness=1",
                  "rollout.importance_cap=2.0")
    assert [r["rollout/staleness/max"] for r in ahead] == [0.0, 1.0]
    assert ahead[-1]["agent/tool_calls/mean"] > 0
    weights = [r["actor/behav_imp_weight/mean"] for r in ahead]
    assert weights[0] == pytest.approx(1.0, abs=1e-5) and abs(weights[1] - 1.0) > 1e-4
