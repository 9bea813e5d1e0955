"""trainer.loggers and trainer.log_samples through the real CLI: TensorBoard holds every scalar of
metrics.jsonl at its step, samples go to samples.jsonl and TensorBoard, and the console shows what a
user must see (one sample, val reward, the KL coefficient, reward errors, a readable summary)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TINY = ["rollout.max_new_tokens=6", "trainer.batch_size=4", "trainer.mini_batch_size=4", "data.num_train=16",
        "data.num_val=4", "ray.backend=local"]


def train(output_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "rlhfctl.cli", "train", "recipes/quickstart.yaml",
                           f"trainer.output_dir={output_dir}", *TINY, *overrides],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def read_events(directory: Path) -> tuple[dict[str, dict[int, float]], dict[int, str]]:
    """Every scalar (tag -> step -> value) and the sample text per step, read back from the event files."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(directory), size_guidance={"scalars": 0, "tensors": 0})
    accumulator.Reload()
    scalars = {tag: {event.step: event.value for event in accumulator.Scalars(tag)}
               for tag in accumulator.Tags()["scalars"]}
    texts = {}
    for tag in accumulator.Tags()["tensors"]:
        if tag.startswith("samples"):
            for event in accumulator.Tensors(tag):
                texts[event.step] = event.tensor_proto.string_val[0].decode()
    return scalars, texts


@pytest.mark.slow
def test_tensorboard_holds_every_scalar_of_metrics_jsonl_and_the_samples(tmp_path):
    pytest.importorskip("tensorboard")
    done = train(tmp_path, "trainer.total_steps=4", "trainer.val_every=2", "trainer.log_every=2",
                 "trainer.log_samples=2", "trainer.loggers=[console,jsonl,tensorboard]",
                 "algorithm.kl.use_in_reward=true", "algorithm.kl.controller=adaptive")
    assert done.returncode == 0, done.stdout + done.stderr
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    scalars, texts = read_events(tmp_path / "tensorboard")
    for record in records:
        for key, value in record.items():
            if key != "step" and isinstance(value, (int, float)):
                assert scalars[key][record["step"]] == pytest.approx(value, rel=1e-6, abs=1e-6), key
    assert set(scalars["val/reward/mean"]) == {2, 4}  # validation goes through the same loggers
    assert "kl/coef" in records[0] and len({r["kl/coef"] for r in records}) > 1  # the adaptive coefficient moves
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [s["step"] for s in samples] == [1, 1, 2, 2, 3, 3, 4, 4]
    assert all({"prompt", "response", "score"} <= set(s) for s in samples)
    assert samples[0]["prompt"].startswith("digits") and samples[0]["prompt"] != samples[1]["prompt"]
    assert set(texts) == {1, 2, 3, 4} and samples[0]["response"] in texts[1]
    out = done.stdout
    shown = [line for line in out.splitlines() if line.startswith("sample (step")]
    assert [line.split(")")[0] for line in shown] == ["sample (step 2", "sample (step 4"]  # one per log_every
    assert "val_reward=" in out and "kl_coef=" in out
    summary = out[out.index("run finished"):].splitlines()
    assert "  reward/first_steps: 1-2" in summary and "  reward/last_steps: 3-4" in summary
    first = sum(r["reward/mean"] for r in records[:2]) / 2
    assert any(line.startswith("  reward/first_mean: ") and float(line.split(": ")[1]) == pytest.approx(first, rel=1e-3)
               for line in summary)


@pytest.mark.slow
def test_a_reward_function_failing_with_on_error_zero_is_a_console_warning(tmp_path):
    reward = tmp_path / "judge.py"
    reward.write_text("def score(prompts, responses, **columns):\n    raise RuntimeError('judge unavailable')\n")
    done = train(tmp_path / "run", "trainer.total_steps=2", f"roles.reward.function={reward}:score",
                 "roles.reward.on_error=zero")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "warning: step 1: the reward function failed on 16 samples" in done.stdout


@pytest.mark.parametrize("logger, extra", [("wandb", "wandb"), ("mlflow", "mlflow")])
def test_a_logger_whose_package_is_missing_is_exit_2_naming_the_extra(tmp_path, logger, extra):
    import importlib.util

    if importlib.util.find_spec(logger) is not None:
        pytest.skip(f"{logger} is installed here")
    done = train(tmp_path, f"trainer.loggers=[console,{logger}]")
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"trainer.loggers[1]" in done.stderr and f"rlhfctl[{extra}]" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "metrics.jsonl").exists()  # stopped before launch


def test_an_unknown_logger_is_exit_2_with_the_choices(tmp_path):
    done = train(tmp_path, "trainer.loggers=[console,tensorbored]")
    assert done.returncode == 2
    assert "trainer.loggers[1]: 'tensorbored' is not one of: console, jsonl, tensorboard, wandb, mlflow" in done.stderr
