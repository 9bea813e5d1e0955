"""rollout.dtype end to end on a real local Ray: a float32 actor sampling in bf16 (through its copy of the model
colocated, or a rollout group of its own that takes bf16 weights over the channel) logs rollout/logprob_diff, the gap
between the engine's and the actor's log-probs, at every step."""

from __future__ import annotations

import math

import pytest

from tests.trainer.test_training_runs import train

TINY = ["trainer.total_steps=2", "trainer.batch_size=4", "trainer.mini_batch_size=4", "rollout.n=2",
        "rollout.max_new_tokens=8", "data.num_train=16"]
SEPARATE = ["resource_pools.gen={process_on_nodes: [1], use_gpu: false}", "rollout.placement=separate", "rollout.pool=gen",
            "rollout.sync_check_every=1"]


@pytest.mark.slow
@pytest.mark.parametrize("placement", [[], SEPARATE], ids=["colocated", "separate"])
def test_a_bf16_rollout_trains_and_logs_the_log_prob_gap_every_step(ray_session, tmp_path, placement):
    records = train("quickstart.yaml", tmp_path, *TINY, *placement, "rollout.dtype=bfloat16", "rollout.importance_cap=2.0")
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        assert 0 < record["rollout/logprob_diff"] < 0.05, record["rollout/logprob_diff"]
        assert math.isfinite(record["actor/pg_loss"]) and record["actor/grad_norm"] > 0
    if placement:  # the probe after each sync: the bf16 engine scores near the float32 actor
        assert all(0 < record["rollout/sync_check_diff"] < 0.05 for record in records)
