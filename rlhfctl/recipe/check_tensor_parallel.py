"""Validation of ``rollout.vllm.tensor_parallel_size`` (t): where the engines sit and whether vLLM can shard the model.

An engine spans t consecutive ranks of the generating pool (the actor's pool when colocated, ``rollout.pool``
with ``placement: separate``), so the pool has ``world / t`` engines. vLLM shards a model over t ranks only when
(the rules of vLLM 0.32, ``vllm/model_executor/layers``):

- t divides every entry of ``resource_pools.<pool>.process_on_nodes`` (one engine stays on one node);
- t divides ``num_attention_heads`` (``ModelConfig.verify_with_parallel_config``);
- the KV heads split evenly (t divides ``num_key_value_heads``) or, when t exceeds them, are replicated whole
  (``num_key_value_heads`` divides t; ``QKVParallelLinear``);
- t divides ``intermediate_size`` (``MergedColumnParallelLinear``);
- t divides the vocabulary padded up to a multiple of 64 (``VocabParallelEmbedding``: ``pad_vocab_size`` then
  ``divide(padded, t)``), which holds for every t dividing 64.

Each problem is one error (exit 2) naming ``rollout.vllm.tensor_parallel_size``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlhfctl.recipe.check_runtime import _model_fields
from rlhfctl.recipe.errors import Issue, error
from rlhfctl.recipe.pools import PoolInfo
from rlhfctl.recipe.schema import ModelConfig
from rlhfctl.recipe.specs import Recipe
from rlhfctl.rollout.tensor_parallel import engine_groups  # the engines' layout has its one home with the vLLM engine

__all__ = ["KEY", "VOCAB_PADDING", "check_tensor_parallel", "engine_groups", "engines_line", "shard_problems"]

KEY = "rollout.vllm.tensor_parallel_size"
#: vLLM's ``DEFAULT_VOCAB_PADDING_SIZE``: the embedding and the head are padded to a multiple of it before sharding.
VOCAB_PADDING = 64


def engines_line(world_size: int, tensor_parallel_size: int) -> str:
    """"vllm engines: 2 x TP 2: ranks [0,1] [2,3]": what ``inspect-dispatch`` shows of a pool's engines."""
    groups = engine_groups(world_size, tensor_parallel_size)
    ranks = " ".join("[" + ",".join(str(rank) for rank in group) + "]" for group in groups)
    return f"vllm engines: {len(groups)} x TP {int(tensor_parallel_size)}: ranks {ranks}"


def shard_problems(t: int, fields: Mapping[str, Any], vocab: int | None) -> list[str]:
    """Why vLLM cannot shard a model of these config ``fields`` (and ``vocab`` tokens, None: unknown) over t ranks."""
    problems = []
    heads = fields.get("num_attention_heads")
    if heads is not None and int(heads) % t:
        problems.append(f"num_attention_heads {int(heads)} is not divisible by {t}")
    kv = fields.get("num_key_value_heads") or heads
    if kv is not None and int(kv) % t and t % int(kv):
        problems.append(f"num_key_value_heads {int(kv)} neither splits evenly over {t} ranks nor replicates whole "
                        f"(vLLM needs {t} % {int(kv)} == 0 when t exceeds the KV heads)")
    inner = fields.get("intermediate_size")
    if inner is not None and int(inner) % t:
        problems.append(f"intermediate_size {int(inner)} is not divisible by {t}")
    if vocab is not None:
        padded = -(-int(vocab) // VOCAB_PADDING) * VOCAB_PADDING
        if padded % t:
            problems.append(f"the vocabulary of {int(vocab)} tokens, padded to {padded} (a multiple of {VOCAB_PADDING}), "
                            f"is not divisible by {t}")
    return problems


def check_tensor_parallel(recipe: Recipe) -> list[Issue]:
    """Errors for a ``rollout.vllm.tensor_parallel_size`` that the generating pool or the actor's model cannot take."""
    rollout = recipe.rollout
    t = int(rollout.vllm.tensor_parallel_size)
    if rollout.engine != "vllm" or t == 1:
        return []
    issues = []
    if rollout.agent:
        issues.append(error(KEY, f"{KEY}: {t} with rollout.multi_turn: an agent's rounds differ from rank to rank, and the "
                                 "ranks of one engine must send it the same requests; use tensor_parallel_size: 1"))
    actor = recipe.roles.get("actor")
    name = rollout.pool or (None if actor is None else actor.pool)
    pool = recipe.pools.get(name) if name is not None else None
    if pool is not None:
        issues += _pool_issues(t, pool)
    if actor is not None and actor.model is not None:
        issues += _model_issues(t, actor.model)
    return issues


def _pool_issues(t: int, pool: PoolInfo) -> list[Issue]:
    uneven = [count for count in pool.process_on_nodes if count % t]
    if not uneven:
        return []
    return [error(KEY, f"{KEY}: {t} does not divide the ranks per node of pool {pool.name} "
                       f"(resource_pools.{pool.name}.process_on_nodes: {list(pool.process_on_nodes)}); an engine spans "
                       f"{t} consecutive ranks on one node; use a t that divides each entry")]


def _model_issues(t: int, model: ModelConfig) -> list[Issue]:
    found = _model_fields(model)
    if found is None:
        return []
    source, fields = found
    vocab = fields.get("vocab_size")
    if vocab is None and VOCAB_PADDING % t:  # an inline config takes its vocabulary from the tokenizer
        vocab = _tokenizer_vocab(model)
    problems = shard_problems(t, fields, None if vocab is None else int(vocab))
    return [error(KEY, f"{KEY}: {t} cannot shard the actor's model ({source}): {problem}") for problem in problems]


def _tokenizer_vocab(model: ModelConfig) -> int | None:
    """The tokenizer's size, which an inline config without ``vocab_size`` takes (None when it cannot be read here)."""
    try:
        from rlhfctl.models.loading import load_tokenizer  # keeps transformers off the CLI's fast path

        return len(load_tokenizer(model, trust_remote_code=bool(model.trust_remote_code)))
    except Exception:  # noqa: BLE001 - a tokenizer not readable here: the engine's start speaks for it
        return None
