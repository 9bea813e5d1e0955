"""The supervised stages end to end on a real local Ray with the tiny qwen2: sft, reward model and dpo learn."""

from __future__ import annotations

import json
from pathlib import Path

from rlhfctl.models.loading import load_causal_lm, load_tokenizer
from rlhfctl.recipe import load_recipe, validate_recipe
from rlhfctl.tasks import get_task
from rlhfctl.trainer import run_training

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def train(recipe: str, output_dir: Path, *overrides: str) -> tuple[dict, list[dict]]:
    cfg = load_recipe(RECIPES / recipe, [f"trainer.output_dir={output_dir}", *overrides])
    report = validate_recipe(cfg)
    assert report.ok, [issue.message for issue in report.errors]
    summary = run_training(cfg)
    records = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    return summary, records


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def test_sft_loss_falls_data_parallel_on_packed_file_data(ray_session, tmp_path):
    demos = tmp_path / "demos.jsonl"
    demos.write_text("".join(json.dumps(record) + "\n" for record in get_task("digits").make_demonstrations(320, 0)))
    summary, records = train(
        "sft-quickstart.yaml", tmp_path / "sft", f"data.train_files=[{demos}]", "data.eval_fraction=0.1",
        "data.packing=true", "resource_pools.main.process_on_nodes=[2]", "trainer.total_steps=14", "trainer.val_every=0",
    )
    losses = [record["loss"] for record in records]
    assert [record["step"] for record in records] == list(range(1, 15))
    assert mean(losses[-3:]) < mean(losses[:3]) - 0.5, losses
    assert "eval/loss" in records[-1] and summary["eval/loss"] == records[-1]["eval/loss"]
    assert records[-1]["perf/tokens_per_s"] > 0 and records[-1]["tokens/response"] > 0
    # The exported model loads back through model.path, with the character tokenizer.
    model_dir = tmp_path / "sft" / "model"
    tokenizer = load_tokenizer({"path": str(model_dir)})
    assert type(tokenizer).__name__ == "CharTokenizer" and tokenizer("ab")["input_ids"] == [68, 69]
    assert load_causal_lm({"path": str(model_dir)}, tokenizer).config.hidden_size == 64


def test_reward_model_ranks_held_out_pairs(ray_session, tmp_path):
    summary, records = train("reward-model-quickstart.yaml", tmp_path, "trainer.total_steps=16", "data.num_train=512",
                             "data.num_val=128", "trainer.val_every=0")
    assert summary["eval/accuracy"] >= 0.8, records[-1]
    assert records[-1]["loss"] < records[0]["loss"] and summary["eval/margin"] > 0
    assert (tmp_path / "model" / "config.json").is_file()
    assert json.loads((tmp_path / "model" / "config.json").read_text())["architectures"] == ["Qwen2ForSequenceClassification"]


def test_dpo_loss_falls_and_the_margin_rises(tmp_path):
    # The local backend (every rank in this process) is enough here and starts faster.
    summary, records = train("dpo-quickstart.yaml", tmp_path, "ray.backend=local", "trainer.total_steps=8",
                             "data.num_train=128", "data.num_val=32", "trainer.val_every=0")
    assert abs(records[0]["loss"] - 0.6931) < 1e-3  # the policy starts equal to its reference
    assert records[-1]["loss"] < records[0]["loss"] and records[-1]["rewards/margin"] > records[0]["rewards/margin"]
    assert summary["eval/accuracy"] > 0.5
