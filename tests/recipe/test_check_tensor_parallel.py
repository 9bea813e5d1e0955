"""rollout.vllm.tensor_parallel_size: the engines' layout and vLLM's sharding rules, each refusal exit 2 naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlhfctl.recipe import load_recipe
from rlhfctl.recipe.check_tensor_parallel import KEY, engine_groups, engines_line, shard_problems
from rlhfctl.recipe.validate import validate_recipe

QUICKSTART = Path(__file__).resolve().parents[2] / "recipes" / "quickstart.yaml"
VLLM = ["rollout.engine=vllm"]


def tp_errors(*overrides: str) -> list[str]:
    """The messages validate gives under rollout.vllm.tensor_parallel_size for the quickstart with ``overrides``."""
    report = validate_recipe(load_recipe(QUICKSTART, [*VLLM, *overrides]))
    return [issue.message for issue in report.errors if issue.key_path == KEY]


def test_engines_are_consecutive_blocks_of_t_ranks_and_the_line_names_them():
    assert engine_groups(4, 2) == [[0, 1], [2, 3]]
    assert engine_groups(2, 1) == [[0], [1]]
    assert engine_groups(8, 8) == [list(range(8))]
    assert engines_line(4, 2) == "vllm engines: 2 x TP 2: ranks [0,1] [2,3]"
    assert engines_line(2, 2) == "vllm engines: 1 x TP 2: ranks [0,1]"


def test_attention_heads_and_intermediate_size_must_split_over_t():
    fields = {"num_attention_heads": 6, "num_key_value_heads": 6, "intermediate_size": 102}
    assert shard_problems(2, fields, 128) == []
    problems = shard_problems(4, fields, 128)
    assert problems[0] == "num_attention_heads 6 is not divisible by 4"
    assert "num_key_value_heads 6 neither splits evenly over 4 ranks nor replicates whole" in problems[1]
    assert problems[2] == "intermediate_size 102 is not divisible by 4"


def test_kv_heads_split_evenly_or_replicate_whole_as_vllm_does():
    # t <= kv heads: they split (8 / 4); t > kv heads: each is replicated t / kv times when kv divides t.
    assert shard_problems(4, {"num_attention_heads": 8, "num_key_value_heads": 8}, None) == []
    assert shard_problems(8, {"num_attention_heads": 64, "num_key_value_heads": 8}, None) == []  # Llama-3-70B at TP 8
    assert shard_problems(16, {"num_attention_heads": 64, "num_key_value_heads": 8}, None) == []  # replicated twice
    assert shard_problems(4, {"num_attention_heads": 28, "num_key_value_heads": 2}, None) == []  # 2 replicas each
    problems = shard_problems(4, {"num_attention_heads": 12, "num_key_value_heads": 6}, None)
    assert problems == ["num_key_value_heads 6 neither splits evenly over 4 ranks nor replicates whole "
                        "(vLLM needs 4 % 6 == 0 when t exceeds the KV heads)"]
    # No num_key_value_heads: as many KV heads as attention heads (transformers' default).
    assert shard_problems(2, {"num_attention_heads": 4}, None) == []


def test_the_vocabulary_padded_to_64_must_split_over_t():
    assert shard_problems(2, {}, 100) == []  # 128 / 2
    assert shard_problems(8, {}, 152064) == []  # Qwen2.5: any t dividing 64 passes
    assert shard_problems(3, {}, 150) == []  # padded to 192 = 3 x 64
    assert shard_problems(3, {}, 100) == ["the vocabulary of 100 tokens, padded to 128 (a multiple of 64), is not divisible by 3"]


@pytest.mark.slow
def test_validate_refuses_each_problem_under_the_key_and_exits_2(tmp_path):
    """Through validate_recipe and the CLI: the pool's ranks per node, the heads, the vocabulary; t = 2 on the quickstart
    at two ranks passes."""
    from typer.testing import CliRunner

    from rlhfctl.cli import app

    assert tp_errors(f"{KEY}=2", "resource_pools.main.process_on_nodes=[2]") == []
    pool = tp_errors(f"{KEY}=2", "resource_pools.main.process_on_nodes=[3]")
    assert pool == [f"{KEY}: 2 does not divide the ranks per node of pool main (resource_pools.main.process_on_nodes: [3]); "
                    "an engine spans 2 consecutive ranks on one node; use a t that divides each entry"]
    heads = tp_errors(f"{KEY}=4", "resource_pools.main.process_on_nodes=[4]")  # the quickstart's 2 heads over 4 ranks
    assert heads == [f"{KEY}: 4 cannot shard the actor's model (roles.actor.model.config): num_attention_heads 2 is not divisible by 4"]
    # t = 3 on a model of 3 heads of 32: only the character tokenizer's 100 ids (padded to 128) do not split.
    model = "roles.actor.model.config"
    vocab = tp_errors(f"{KEY}=3", "resource_pools.main.process_on_nodes=[3]", f"{model}.num_attention_heads=3",
                      f"{model}.num_key_value_heads=3", f"{model}.hidden_size=96", f"{model}.intermediate_size=192")
    assert vocab == [f"{KEY}: 3 cannot shard the actor's model ({model}): the vocabulary of 100 tokens, padded to 128 "
                     "(a multiple of 64), is not divisible by 3"]
    result = CliRunner().invoke(app, ["validate", str(QUICKSTART), *VLLM, f"{KEY}=2", "resource_pools.main.process_on_nodes=[3]"])
    assert result.exit_code == 2, result.output
    assert f"{KEY}: 2 does not divide the ranks per node" in result.stderr


def test_inspect_dispatch_shows_the_engines_and_their_ranks_colocated_and_separate():
    from rlhfctl.recipe.dataflow import training_step
    from rlhfctl.recipe.resolved import resolve

    colocated = training_step(resolve(load_recipe(QUICKSTART, [*VLLM, f"{KEY}=2", "resource_pools.main.process_on_nodes=[4]"])))
    assert "vllm engines: 2 x TP 2: ranks [0,1] [2,3]" in colocated[0].note
    separate = training_step(resolve(load_recipe(QUICKSTART, [
        *VLLM, f"{KEY}=2", "resource_pools.gen={process_on_nodes: [2], use_gpu: false}", "rollout.placement=separate",
        "rollout.pool=gen"])))
    assert "engine: vllm, vllm engines: 1 x TP 2: ranks [0,1] on pool gen (rollout.placement: separate)" in separate[0].note


def test_agent_rollouts_are_refused_with_t_above_1_and_t_1_checks_nothing():
    from rlhfctl.recipe.check_tensor_parallel import check_tensor_parallel
    from rlhfctl.recipe.resolved import resolve

    def issues(*overrides: str) -> list[str]:
        cfg = load_recipe(QUICKSTART, [*VLLM, "resource_pools.main.process_on_nodes=[2]", *overrides])
        return [f"{issue.key_path}: {issue.message}" for issue in check_tensor_parallel(resolve(cfg))]

    agent = issues(f"{KEY}=2", "rollout.multi_turn.enable=true")
    assert len(agent) == 1 and agent[0].startswith(f"{KEY}: {KEY}: 2 with rollout.multi_turn: an agent's rounds differ")
    assert issues(f"{KEY}=1", "resource_pools.main.process_on_nodes=[3]") == []
    assert issues(f"{KEY}=2", "rollout.engine=hf", "resource_pools.main.process_on_nodes=[3]") == []  # no engine to split
