"""A verl-format gsm8k parquet trains unchanged with the bundled gsm8k reward, on a real local Ray."""

from __future__ import annotations

from rlhfctl.recipe import load_recipe
from rlhfctl.recipe.validate import validate_recipe
from tests.data.verl_rows import gsm8k_rows, write_parquet
from tests.trainer.test_training_runs import RECIPES, train


def test_a_verl_gsm8k_parquet_trains_two_steps_with_the_bundled_gsm8k_reward(ray_session, tmp_path):
    train_file = write_parquet(tmp_path / "train.parquet", gsm8k_rows(8))
    val_file = write_parquet(tmp_path / "test.parquet", gsm8k_rows(4, split="test"))
    overrides = [f"data.train_files=[{train_file}]", f"data.val_files=[{val_file}]", "data.task=null",
                 "data.max_prompt_length=160", "roles.actor.model.config.max_position_embeddings=256", "roles.reward.function=rlhfctl.rewards:gsm8k",
                 "roles.reward.function_kwargs={method: flexible}", "rollout.max_new_tokens=8",
                 "trainer.batch_size=4", "trainer.mini_batch_size=4", "trainer.total_steps=2", "trainer.val_every=2",
                 "rollout.val_n=2"]
    report = validate_recipe(load_recipe(RECIPES / "quickstart.yaml", overrides))
    assert report.ok, [issue.message for issue in report.errors]
    assert [summary.ground_truth for summary in report.data] == ["reward_model.ground_truth"] * 2
    assert all(summary.chat_template for summary in report.data)  # message prompts: rendered with the template

    records = train("quickstart.yaml", tmp_path / "run", *overrides)
    assert [record["step"] for record in records] == [1, 2]
    last = records[-1]
    assert 0.0 <= last["reward/mean"] <= 1.0
    assert last["val/openai/gsm8k/samples"] == 8  # 4 prompts x rollout.val_n 2, all from one data_source
    assert 0.0 <= last["val/openai/gsm8k/pass@2"] <= 1.0
