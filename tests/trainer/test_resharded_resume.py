"""A run checkpointed with FSDP2 on two ranks resumes on one rank (DDP), and back, every step logged once."""

from __future__ import annotations

import json

import pytest

from tests.trainer.test_training_runs import read_metrics, train

COMMON = ["rollout.max_new_tokens=8", "trainer.batch_size=4", "trainer.mini_batch_size=4", "trainer.save_every=2",
          "data.num_train=16", "trainer.resume=auto"]


@pytest.mark.slow
def test_a_world_2_fsdp2_run_resumes_at_world_1_and_back(ray_session, tmp_path):
    train("quickstart.yaml", tmp_path, "resource_pools.main.process_on_nodes=[2]", "trainer.total_steps=2", *COMMON)
    info = json.loads((tmp_path / "checkpoints" / "step_2" / "actor" / "checkpoint.json").read_text())
    assert (info["strategy"], info["world_size"]) == ("fsdp2", 2)
    train("quickstart.yaml", tmp_path, "resource_pools.main.process_on_nodes=[1]", "trainer.total_steps=4", *COMMON)
    info = json.loads((tmp_path / "checkpoints" / "step_4" / "actor" / "checkpoint.json").read_text())
    assert (info["strategy"], info["world_size"]) == ("ddp", 1)
    train("quickstart.yaml", tmp_path, "resource_pools.main.process_on_nodes=[2]", "trainer.total_steps=6", *COMMON)
    records = read_metrics(tmp_path)
    assert [record["step"] for record in records] == [1, 2, 3, 4, 5, 6]
    assert all(record["actor/grad_norm"] > 0 for record in records)
    assert (tmp_path / "checkpoints" / "step_6" / "actor" / "hf" / "model.safetensors").is_file()
