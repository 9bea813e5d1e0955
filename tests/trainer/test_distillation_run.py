"""On-policy distillation end to end on a real local Ray: a teacher role scores every sampled token.

- a teacher built like the actor's initial model (same inline architecture, same seed) gives a reverse KL of
  exactly 0: distilling alone, the advantages are 0 and the policy stays where it started;
- a larger teacher on a pool of its own gives the dense signal, logged with its log-probs; distilling alone, a run
  without a reward role trains exactly as one whose reward is only logged;
- validate refuses a teacher without a model, one whose tokenizer gives the policy's tokens other ids (naming
  both), and, without a reward role, what needs a reward (exit 2).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.recipe.builders import BASE_RECIPE, validate_cli, write_recipe
from tests.trainer.test_training_runs import train

INLINE = "{model_type: qwen2, hidden_size: 64, num_hidden_layers: 2, num_attention_heads: 2, num_key_value_heads: 2, intermediate_size: 128, max_position_embeddings: 128}"
LARGER = "{model_type: qwen2, hidden_size: 128, num_hidden_layers: 3, num_attention_heads: 4, num_key_value_heads: 2, intermediate_size: 256, max_position_embeddings: 128}"
RUN = ["rollout.max_new_tokens=8", "trainer.batch_size=4", "trainer.mini_batch_size=4", "rollout.n=2",
       "data.num_train=16", "trainer.total_steps=2"]


def test_a_teacher_equal_to_the_initial_policy_gives_no_signal_on_the_first_step(ray_session, tmp_path):
    records = train("quickstart.yaml", tmp_path, *RUN, f"roles.teacher={{pool: main, model: {{config: {INLINE}}}}}")
    # No signal, so zero advantages (mix 0): the policy stays the teacher's equal, step after step.
    assert [r["distill/reverse_kl/mean"] for r in records] == [0.0, 0.0]
    assert [r["actor/pg_loss"] for r in records] == [0.0, 0.0]
    assert all(r["distill/teacher_log_prob/mean"] < 0 for r in records)


def test_a_larger_teacher_on_its_own_pool_distills_alone_mixed_or_without_a_reward(ray_session, tmp_path):
    own_pool = ["resource_pools.teach={process_on_nodes: [1], use_gpu: false}",
                f"roles.teacher={{pool: teach, model: {{config: {LARGER}}}}}"]
    alone = train("quickstart.yaml", tmp_path / "alone", *RUN, *own_pool)
    mixed = train("quickstart.yaml", tmp_path / "mixed", *RUN, *own_pool, "algorithm.distillation.mix=1.0")
    for records in (alone, mixed):
        assert all(r["distill/reverse_kl/mean"] != 0.0 and math.isfinite(r["distill/reverse_kl/mean"]) for r in records)
    # Same samples at step 1 (same seed, same untouched policy): the same teacher signal, whatever the mix.
    assert alone[0]["distill/reverse_kl/mean"] == mixed[0]["distill/reverse_kl/mean"]
    assert alone[0]["distill/teacher_log_prob/mean"] == mixed[0]["distill/teacher_log_prob/mean"]
    assert alone[0]["reward/mean"] == mixed[0]["reward/mean"]  # the reward is scored (and logged) either way
    # Without a reward role at all, mix 0 trains on the same advantages: the same numbers, no reward/* logged.
    unrewarded = train("quickstart.yaml", tmp_path / "unrewarded", *RUN, *own_pool, "roles.reward=null")
    for key in ("distill/reverse_kl/mean", "distill/teacher_log_prob/mean", "actor/pg_loss", "actor/grad_norm"):
        assert [r[key] for r in unrewarded] == [r[key] for r in alone], key
    assert not any(key.startswith("reward/") for record in unrewarded for key in record)


@pytest.fixture
def recipe_file(tmp_path: Path) -> Path:
    return write_recipe(tmp_path, BASE_RECIPE)


def test_a_teacher_without_a_model_exits_2(recipe_file):
    result = validate_cli(recipe_file, "roles.teacher={pool: main}")
    assert result.exit_code == 2
    assert "roles.teacher.model: set path" in result.stderr


def test_a_teacher_whose_tokenizer_gives_other_ids_exits_2_naming_both(recipe_file, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({"<unk>": 0, "<eos>": 1, "digits": 2}, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    folder = tmp_path / "word_tokenizer"
    PreTrainedTokenizerFast(tokenizer_object=words, eos_token="<eos>", unk_token="<unk>").save_pretrained(folder)
    result = validate_cli(recipe_file, f"roles.teacher={{pool: main, model: {{tokenizer_path: {folder}, config: {INLINE}}}}}")
    assert result.exit_code == 2, result.output
    assert "roles.teacher.model: the teacher's tokenizer" in result.stderr
    assert str(folder) in result.stderr and "the inline character tokenizer" in result.stderr
    assert "tokens differ" in result.stderr


def test_a_teacher_of_the_policys_tokenizer_is_valid(recipe_file):
    result = validate_cli(recipe_file, f"roles.teacher={{pool: main, model: {{config: {LARGER}}}}}")
    assert result.exit_code == 0, result.output


def test_distillation_without_a_reward_refuses_what_needs_one(recipe_file):
    teacher = f"roles.teacher={{pool: main, model: {{config: {INLINE}}}}}"
    assert validate_cli(recipe_file, "roles.reward=null").exit_code == 2  # no teacher: a reward is required
    result = validate_cli(recipe_file, "roles.reward=null", teacher, "trainer.val_every=5", "algorithm.adv_estimator=remax")
    assert result.exit_code == 2
    assert "trainer.val_every: validation scores responses with the reward" in result.stderr
    assert "algorithm.adv_estimator: remax scores a greedy baseline" in result.stderr
    mixed = validate_cli(recipe_file, "roles.reward=null", teacher, "algorithm.distillation.mix=0.5")
    assert mixed.exit_code == 2 and "roles.reward: missing required value" in mixed.stderr
    assert validate_cli(recipe_file, "roles.reward=null", teacher).exit_code == 0
