"""rlhfctl validate shows what it read of each data file (table and --format json), and exits 2 when the reward
function needs a ground_truth that no sampled row of a file gives."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from rlhfctl.cli import app
from tests.data.verl_rows import gsm8k_rows, write_jsonl, write_parquet
from tests.recipe.builders import recipe_data, write_recipe


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """rewards.py (needs_truth takes ground_truth), a verl train.parquet and test.jsonl."""
    (tmp_path / "rewards.py").write_text(
        "def needs_truth(prompts, responses, ground_truth, **columns):\n    return [0.0 for _ in responses]\n")
    write_parquet(tmp_path / "train.parquet", gsm8k_rows(100))
    write_jsonl(tmp_path / "test.jsonl", gsm8k_rows(10, "test"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("rewards", None)
    return tmp_path


def _recipe(folder: Path, train: str = "train.parquet") -> Path:
    recipe = recipe_data(data={"train_files": [train], "val_files": ["test.jsonl"]})
    recipe["roles"]["reward"]["function"] = "rewards.py:needs_truth"
    return write_recipe(folder, recipe)


def _validate(runner, *args: str):
    result = runner.invoke(app, ["validate", *args], env={"COLUMNS": "200"})
    assert "Traceback" not in result.output, result.output
    return result


def test_validate_shows_a_data_table_for_a_verl_file(runner, workdir):
    result = _validate(runner, str(_recipe(workdir)))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert any(line.startswith("Data files (prompt, ground truth and columns from the first 64 rows") for line in lines)
    train = next(line for line in lines if "data.train_files[0]" in line)
    for cell in ("train.parquet", " 100 ", "messages -> chat template", "reward_model.ground_truth",
                 "data_source, prompt, ability, reward_model, extra_info"):
        assert cell in train, train
    val = next(line for line in lines if "data.val_files[0]" in line)
    assert "test.jsonl" in val and " 10 " in val


def test_validate_json_holds_the_data_summary(runner, workdir):
    result = _validate(runner, str(_recipe(workdir)), "--format", "json")
    assert result.exit_code == 0, result.output
    train, val = json.loads(result.stdout)["data"]
    assert train == {
        "key": "data.train_files[0]", "path": "train.parquet", "rows": 100, "sampled": 64,
        "columns": ["data_source", "prompt", "ability", "reward_model", "extra_info"],
        "prompt_forms": ["messages"], "chat_template": True, "prompt": "messages -> chat template",
        "ground_truth_keys": ["reward_model.ground_truth"], "ground_truth_rows": 64,
        "ground_truth": "reward_model.ground_truth",
    }
    assert (val["key"], val["rows"], val["sampled"]) == ("data.val_files[0]", 10, 10)


def test_validate_exits_2_when_no_row_gives_the_ground_truth_the_reward_needs(runner, workdir):
    rows = gsm8k_rows(5)
    for row in rows:
        del row["reward_model"]
    write_jsonl(workdir / "bare.jsonl", rows)
    result = _validate(runner, str(_recipe(workdir, "bare.jsonl")))
    assert result.exit_code == 2, result.output
    assert ("error: data.train_files[0]: bare.jsonl: none of the first 5 rows has a ground_truth (no 'ground_truth' "
            "column, no reward_model.ground_truth), and roles.reward.function needs_truth needs it") in result.stderr
    bare = next(line for line in result.stdout.splitlines() if "data.train_files[0]" in line)
    assert " none " in bare
