"""Non-vanilla policy losses train end to end through the actor worker, micro-batched, on a real local Ray."""

from __future__ import annotations

import math

import pytest

from tests.trainer.test_training_runs import SHORT_RUN, train


@pytest.mark.parametrize("loss, agg", [("gspo", "seq-mean-token-mean"), ("sapo", "token-mean")])
def test_a_registered_policy_loss_trains_with_micro_batches(ray_session, tmp_path, loss, agg):
    records = train("quickstart.yaml", tmp_path, *SHORT_RUN, f"roles.actor.policy_loss={loss}",
                    f"roles.actor.loss_agg_mode={agg}", "roles.actor.micro_batch_size=4")
    assert [r["step"] for r in records] == [1, 2, 3]
    for record in records:
        assert math.isfinite(record["actor/pg_loss"]) and record["actor/grad_norm"] > 0
