"""rlhfctl eval and rlhfctl generate through the CLI, on a real (tiny) quickstart run: eval of a checkpoint equals
the run's own val/* at that step, sampled validation included; generate writes the rows and columns it says."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from rlhfctl.cli import app

pytestmark = pytest.mark.slow

RUN_OVERRIDES = ["trainer.total_steps=2", "trainer.val_every=2", "trainer.save_every=2", "trainer.export_hf=true",
                 "trainer.batch_size=4", "trainer.mini_batch_size=4", "rollout.n=2", "rollout.val_n=2",
                 "rollout.max_new_tokens=8", "data.num_train=8", "data.num_val=6"]


@pytest.fixture(scope="module")
def run_dir(ray_session, tmp_path_factory) -> Path:
    """A two-step quickstart run that validated (2 sampled responses per prompt) and saved at step 2."""
    output = tmp_path_factory.mktemp("eval") / "run"
    result = CliRunner().invoke(app, ["train", "quickstart", f"trainer.output_dir={output}", *RUN_OVERRIDES, "--quiet"])
    assert result.exit_code == 0, result.output
    return output


def _logged_val(run: Path, step: int) -> dict[str, float]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    (record,) = [r for r in records if r["step"] == step]
    return {key: value for key, value in record.items() if key.startswith("val/")}


def test_eval_of_a_run_equals_the_val_metrics_it_logged_at_that_step(run_dir):
    result = CliRunner().invoke(app, ["eval", str(run_dir), "--format", "json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    logged = _logged_val(run_dir, 2)
    assert set(logged) == {"val/reward/mean", "val/samples", "val/pass@2"}
    assert report["val_metrics"] == logged  # sampled (val_n 2): the same draws, the same scores
    assert report["step"] == 2 and report["n"] == 2 and report["policy"].endswith("step_2")
    everything = report["sources"]["all"]
    assert everything["prompts"] == 6 and everything["samples"] == 12
    assert everything["mean"] == pytest.approx(logged["val/reward/mean"], abs=1e-6)
    assert set(everything) >= {"mean_ci95", "pass@1", "pass@2", "pass@2_ci95"}
    assert 0.0 <= everything["pass@1"] <= everything["pass@2"] <= 1.0


def test_eval_of_a_checkpoint_prints_a_table_and_writes_the_scored_samples(run_dir, tmp_path):
    samples = tmp_path / "scored.jsonl"
    checkpoint = run_dir / "checkpoints" / "step_2"
    result = CliRunner().invoke(app, ["eval", str(checkpoint), "--n", "1", "--samples", str(samples)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "mean@1" in result.stdout and "pass@1" in result.stdout and "all" in result.stdout
    rows = [json.loads(line) for line in samples.read_text().splitlines()]
    assert len(rows) == 6 and [row["index"] for row in rows] == list(range(6))
    assert all(row["prompt"].startswith("digits ") and 0.0 <= row["score"] <= 1.0 for row in rows)


def test_generate_from_the_exported_model_writes_parquet_rows_with_log_probs(run_dir, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"digits {i} {i + 1}:", "tag": f"t{i}"}) + "\n" for i in range(3)))
    output = tmp_path / "out.parquet"
    result = CliRunner().invoke(app, ["generate", str(run_dir / "model"), "--data", str(prompts), "--output", str(output),
                                      "--n", "2", "--log-probs", "--quiet"])
    assert result.exit_code == 0, result.output
    table = pq.read_table(output).to_pylist()
    assert len(table) == 6
    assert {"index", "sample", "prompt", "response", "prompt_tokens", "response_tokens", "log_probs", "tag"} <= set(table[0])
    assert [(row["index"], row["sample"]) for row in table] == [(i, s) for i in range(3) for s in range(2)]
    assert table[0]["prompt"] == "digits 0 1:" and table[0]["prompt_tokens"] == len("digits 0 1:")
    for row in table:
        assert 1 <= row["response_tokens"] <= 8 and len(row["log_probs"]) == row["response_tokens"]
        assert all(value <= 0.0 for value in row["log_probs"])


def test_generate_greedy_to_jsonl_is_the_same_twice(run_dir, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "digits 3 4:"}) + "\n")
    outputs = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    for output in outputs:
        result = CliRunner().invoke(app, ["generate", str(run_dir), "--data", str(prompts), "--output", str(output), "--greedy"])
        assert result.exit_code == 0, result.output
        assert f"wrote 1 responses to {output}" in result.stdout
    first, second = (json.loads(path.read_text()) for path in outputs)
    assert first == second and first["response_tokens"] >= 1


@pytest.mark.parametrize("args, message", [
    (["generate", "{run}", "--data", "{run}/x.jsonl", "--output", "out.csv"], "--output: out.csv must end in .jsonl or .parquet"),
    (["eval", "{run}/nowhere"], "no such run, checkpoint or model directory"),
    (["eval", "org/model"], "name the recipe that builds and rewards the policy with --recipe"),
])
def test_eval_and_generate_refuse_bad_input_with_one_line(tmp_path, args, message):
    result = CliRunner().invoke(app, [arg.format(run=tmp_path) for arg in args])
    assert result.exit_code == 2
    assert message in result.stderr and "Traceback" not in result.output
