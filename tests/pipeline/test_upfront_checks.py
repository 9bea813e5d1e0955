"""A pipeline checks every stage's data before the first stage trains, and reports every problem at once."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from rlhfctl.cli import app
from rlhfctl.pipeline import PipelineError, pipeline_from_dict, plan_stages

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
LONG_PROMPT = "digits " + " ".join(str(digit % 10) for digit in range(40)) + ":"


def write_jsonl(path: Path, *records: dict) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def sft_then_reward(output_dir: Path, reward_data: Path, *reward_overrides: str) -> dict:
    """sft on the digits task, then a reward model on ``reward_data`` starting from the sft model."""
    return {"output_dir": str(output_dir), "stages": [
        {"name": "sft", "recipe": str(RECIPES / "sft-quickstart.yaml"), "overrides": ["trainer.total_steps=2"]},
        {"name": "reward", "recipe": str(RECIPES / "reward-model-quickstart.yaml"), "overrides": [
            "roles.reward.model.path=${stages.sft.output}", "~roles.reward.model.config", "~data.task",
            f"data.train_files=[{reward_data}]", "trainer.val_every=0", *reward_overrides]},
    ]}


def test_a_bad_data_file_in_the_second_stage_stops_the_pipeline_before_the_first_trains(tmp_path):
    pairs = write_jsonl(tmp_path / "pairs.jsonl", {"prompt": "digits 1 2:", "good": " 12", "rejected": " ab"})
    pipeline = tmp_path / "pipeline.yaml"
    pipeline.write_text(yaml.safe_dump(sft_then_reward(tmp_path / "out", pairs)))
    start = time.perf_counter()
    result = CliRunner().invoke(app, ["pipeline", str(pipeline)])
    seconds = time.perf_counter() - start
    assert result.exit_code == 2, result.output
    assert (f"error: stages.reward ({RECIPES / 'reward-model-quickstart.yaml'}): data.train_files[0]: {pairs}: record 1: "
            "no 'chosen' column for the chosen response (it has: prompt, good, rejected); set data.chosen_key") in result.stderr
    assert "Traceback" not in result.output
    assert not (tmp_path / "out" / "sft").exists()  # no checkpoint, no metrics.jsonl, not even the stage's directory
    assert seconds < 60, seconds


def test_every_problem_of_every_stage_is_listed_in_one_error(tmp_path):
    garbage = tmp_path / "demos.jsonl"
    garbage.write_text("not json\n")
    # The reward stage reads the sft stage's model, which does not exist yet: its pairs are tokenized with the
    # tokenizer that model will hold (sft's inline model: the character tokenizer), so the length is checked too.
    long = write_jsonl(tmp_path / "long.jsonl", {"prompt": LONG_PROMPT, "chosen": " 12", "rejected": " ab"})
    data = sft_then_reward(tmp_path / "out", long)
    data["stages"][0]["overrides"] += [f"data.train_files=[{garbage}]", "~data.task", "trainer.val_every=0"]
    with pytest.raises(PipelineError) as caught:
        plan_stages(pipeline_from_dict(data))
    text = str(caught.value)
    assert text.startswith("2 problems in stages sft, reward; nothing has run:\n")
    assert f"[1] stages.sft ({RECIPES / 'sft-quickstart.yaml'}): data.train_files[0]: {garbage}: line 1: malformed JSON" in text
    assert (f"[2] stages.reward ({RECIPES / 'reward-model-quickstart.yaml'}): data.train_files[0]: {long}: record 1: "
            "prompt + response is 91 tokens, over data.max_length=48") in text
    assert caught.value.key_path == "stages.sft.data.train_files[0]"


def test_the_second_stage_plans_when_its_data_reads(tmp_path):
    pairs = write_jsonl(tmp_path / "pairs.jsonl", {"prompt": "digits 1 2:", "chosen": " 12", "rejected": " ab"})
    plans = plan_stages(pipeline_from_dict(sft_then_reward(tmp_path / "out", pairs)))
    assert [plan.algorithm for plan in plans] == ["sft", "reward_model"]
    # Too long but truncated as the recipe says: fine.
    long = write_jsonl(tmp_path / "long.jsonl", {"prompt": LONG_PROMPT, "chosen": " 12", "rejected": " ab"})
    assert len(plan_stages(pipeline_from_dict(sft_then_reward(tmp_path / "out", long, "data.overlong=truncate")))) == 2


def test_validate_reads_a_stage_recipes_records(tmp_path):
    pairs = write_jsonl(tmp_path / "pairs.jsonl", {"prompt": "digits 1 2:", "chosen": "", "rejected": " ab"})
    result = CliRunner().invoke(app, ["validate", str(RECIPES / "dpo-quickstart.yaml"), f"data.train_files=[{pairs}]",
                                      "~data.task", "trainer.val_every=0"])
    assert result.exit_code == 2, result.output
    assert (f"error: data.train_files[0]: {pairs}: record 1: the chosen response ('chosen') is empty"
            in " ".join(result.stderr.split()))
