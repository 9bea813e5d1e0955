"""The memory plan: what each role holds on each rank, predicted before launch with no weights loaded.

For every role with a model, the model is built from its config on the meta device (shapes only) to
count its parameters; then, per rank:

- **parameters**: trainable roles keep float32 master weights, frozen roles store ``model.dtype``;
- **gradients**: one per trainable parameter, in the master dtype;
- **optimizer state**: AdamW's two float32 moments per trainable parameter (LoRA: the adapter only);
- **strategy**: ``ddp`` holds a full replica per rank; ``fsdp2`` shards every tensor on its first
  dimension, ``ceil(rows / world)`` rows per rank (rank 0 holds the most); ``cpu_offload`` keeps the
  sharded state in host memory;
- **KV cache** (the actor's rollout): rows per rank x (``data.max_prompt_length`` +
  ``rollout.max_new_tokens``) x layers x KV heads x head dim x 2 (keys and values) x dtype bytes.

Roles colocated on a pool share one process per rank, so the plan also sums each pool's roles per
process, next to the device memory when it is known (``--device-memory``, or CUDA's when visible).
``memory/<role>/state_gib`` measures the same parameters + gradients + optimizer state from the live
tensors every step (``workers.memory``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

__all__ = ["MemoryPlan", "RoleMemory", "parse_bytes", "plan_memory", "role_strategy"]

GIB = 2**30
_ADAM_MOMENTS = 2
_MASTER_BYTES = 4  # float32 master weights, gradients and optimizer state
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str) -> int:
    """``80GiB``, ``80GB``, ``81920MiB`` or a plain byte count, as bytes; ValueError otherwise."""
    cleaned = str(text).strip().lower().replace(" ", "")
    number = cleaned.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = cleaned[len(number):]
    if unit not in _UNITS or not number:
        raise ValueError(f"cannot read {text!r} as a memory size; write e.g. 80GiB, 40GB or 81920MiB")
    return int(float(number) * _UNITS[unit])


def role_strategy(role_section: Mapping[str, Any], world_size: int) -> str:
    """``roles.<role>.strategy``: fsdp2 by default when the role has more than one rank, else ddp."""
    strategy = role_section.get("strategy")
    if strategy:
        return str(strategy)
    return "fsdp2" if world_size > 1 else "ddp"


@dataclass(frozen=True)
class RankMemory:
    """Bytes one rank of one role holds."""

    rank: int
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    kv_cache_bytes: int
    offloaded: bool

    @property
    def state_bytes(self) -> int:
        """Parameters + gradients + optimizer state (what ``memory/<role>/state_gib`` measures)."""
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes

    @property
    def device_bytes(self) -> int:
        """What sits in device memory: the state unless offloaded, plus the KV cache."""
        return (0 if self.offloaded else self.state_bytes) + self.kv_cache_bytes


@dataclass(frozen=True)
class RoleMemory:
    """One role's plan: what it is, and what each of its ranks holds."""

    role: str
    pool: str
    world_size: int
    strategy: str
    trainable: bool
    param_dtype: str
    parameters: int
    trainable_parameters: int
    ranks: tuple[RankMemory, ...]
    note: str = ""

    @property
    def largest(self) -> RankMemory:
        """The rank holding the most (rank 0 when shards are uneven)."""
        return max(self.ranks, key=lambda rank: (rank.device_bytes, rank.state_bytes))


@dataclass
class MemoryPlan:
    """Every role's plan, the per-process sums of each pool, and the device memory to compare with."""

    roles: list[RoleMemory] = field(default_factory=list)
    device_memory: int | None = None
    device_source: str | None = None
    skipped: dict[str, str] = field(default_factory=dict)

    def process_bytes(self) -> dict[str, int]:
        """Pool -> device bytes of its largest process (the sum of the roles colocated there)."""
        sums: dict[str, dict[int, int]] = {}
        for role in self.roles:
            for rank in role.ranks:
                per_rank = sums.setdefault(role.pool, {})
                per_rank[rank.rank] = per_rank.get(rank.rank, 0) + rank.device_bytes
        return {pool: max(per_rank.values()) for pool, per_rank in sums.items()}

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly view (bytes as integers)."""
        roles = []
        for role in self.roles:
            entry = {key: value for key, value in asdict(role).items() if key != "ranks"}
            entry["ranks"] = [{**asdict(rank), "state_bytes": rank.state_bytes, "device_bytes": rank.device_bytes}
                              for rank in role.ranks]
            roles.append(entry)
        return {"roles": roles, "process_bytes": self.process_bytes(), "device_memory": self.device_memory,
                "device_source": self.device_source, "skipped": dict(self.skipped)}


# ------------------------------------------------------------------ building the plan


def _shapes(model: torch.nn.Module, trainable_only: bool) -> list[torch.Size]:
    return [parameter.shape for parameter in model.parameters() if parameter.requires_grad or not trainable_only]


def _per_rank_elements(shapes: list[torch.Size], world: int, rank: int, sharded: bool) -> int:
    """Elements this rank holds: everything, or its dim-0 chunk of each tensor (torch.chunk's split)."""
    if not sharded:
        return sum(math.prod(shape) for shape in shapes)
    total = 0
    for shape in shapes:
        rows = shape[0] if len(shape) else 1
        chunk = math.ceil(rows / world)
        mine = max(0, min(chunk, rows - rank * chunk))
        total += mine * (math.prod(shape[1:]) if len(shape) > 1 else 1)
    return total


def _dtype_bytes(dtype: Any) -> int:
    from rlhfctl.models.loading import resolve_dtype

    resolved = resolve_dtype(str(dtype))
    return torch.tensor([], dtype=resolved if isinstance(resolved, torch.dtype) else torch.float32).element_size()


def _meta_model(kind: str, model_cfg: Mapping[str, Any], lora: Any) -> torch.nn.Module:
    """The role's model with meta tensors: the same loaders the workers use, on inline config fields."""
    from rlhfctl.models import loading

    inline = dict(model_cfg)
    if inline.get("path"):  # the config only, from a local directory or the HF cache: validate never downloads
        from transformers import AutoConfig

        try:
            config = AutoConfig.from_pretrained(os.path.expanduser(str(inline["path"])), local_files_only=True,
                                                trust_remote_code=bool(inline.get("trust_remote_code")))
        except OSError:
            raise LookupError(f"{inline['path']} is neither a local directory nor in the Hugging Face cache, "
                              "and the plan reads only local configs") from None
        inline = {**inline, "path": None, "tokenizer_path": None, "config": config.to_dict()}
    tokenizer = loading.load_tokenizer(inline, trust_remote_code=bool(inline.get("trust_remote_code")))
    build = {"causal": loading.load_causal_lm, "value": loading.load_token_value_model,
             "classifier": loading.load_sequence_classifier}[kind]
    with torch.device("meta"):
        model = build(inline, tokenizer, dtype=None, trust_remote_code=bool(inline.get("trust_remote_code")), seed=0)
        if lora is not None and lora is not False:
            from workers.lora import apply_lora

            model = apply_lora(model, {} if lora is True else lora, seed=0)
    return model


def _kv_cache_bytes(config: Any, rows: int, length: int, dtype_bytes: int) -> int:
    heads = int(getattr(config, "num_attention_heads"))
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or int(config.hidden_size) // heads)
    return rows * length * int(config.num_hidden_layers) * kv_heads * head_dim * 2 * dtype_bytes


def _role_memory(recipe: Mapping[str, Any], spec: "_RoleSpec", world: int, pool: str, kv_rows: int) -> RoleMemory:
    section = dict((recipe.get("roles") or {}).get(spec.role) or {})
    model = _meta_model(spec.kind, spec.model_cfg, section.get("lora") if spec.role == "actor" else None)
    strategy = role_strategy(section, world)
    offload = bool((section.get("fsdp") or {}).get("cpu_offload"))
    all_shapes, trained = _shapes(model, False), (_shapes(model, True) if spec.trainable else [])
    dtype = str(spec.model_cfg.get("dtype") or "float32")
    compute_bytes = _dtype_bytes(dtype)
    kv = 0
    if spec.role == "actor" and kv_rows:
        data, rollout = recipe.get("data") or {}, recipe.get("rollout") or {}
        length = int(data.get("max_prompt_length") or 32) + int(rollout.get("max_new_tokens") or 32)
        kv = _kv_cache_bytes(model.config, kv_rows, length, compute_bytes)
    sharded = strategy == "fsdp2" and world > 1
    ranks = []
    for rank in range(world):
        trained_elements = _per_rank_elements(trained, world, rank, sharded)
        frozen_elements = _per_rank_elements(all_shapes, world, rank, sharded) - trained_elements
        params = trained_elements * _MASTER_BYTES + frozen_elements * compute_bytes
        grads = trained_elements * _MASTER_BYTES
        ranks.append(RankMemory(rank, params, grads, grads * _ADAM_MOMENTS, kv, offload))
    return RoleMemory(
        role=spec.role, pool=pool, world_size=world, strategy=strategy, trainable=spec.trainable,
        param_dtype="float32 (master)" if spec.trainable else dtype,
        parameters=sum(math.prod(shape) for shape in all_shapes),
        trainable_parameters=sum(math.prod(shape) for shape in trained), ranks=tuple(ranks),
        note="LoRA: adapter trained" if spec.trainable and section.get("lora") not in (None, False) else "",
    )


@dataclass(frozen=True)
class _RoleSpec:
    role: str
    kind: str  # causal | value | classifier
    trainable: bool
    model_cfg: dict[str, Any]


def _role_specs(recipe: Mapping[str, Any]) -> list[_RoleSpec]:
    """The roles with a model, what kind of model each builds, and whether it trains."""
    from rlhfctl.recipe.stages import STAGES
    from workers.recipe import model_config

    roles = recipe.get("roles") or {}
    stage = STAGES.get(str((recipe.get("algorithm") or {}).get("name") or "ppo"))
    present = {name for name, section in roles.items() if section is not None}
    specs = []
    if "actor" in present and (stage is None or stage.trained_role == "actor"):
        specs.append(_RoleSpec("actor", "causal", True, model_config(recipe, "actor")))
    if "reference" in present and (stage is None or stage.algorithm == "dpo"):
        specs.append(_RoleSpec("reference", "causal", False, model_config(recipe, "reference", fallback="actor")))
    if "critic" in present and stage is None:
        specs.append(_RoleSpec("critic", "value", True, model_config(recipe, "critic", fallback="actor")))
    reward_trained = stage is not None and stage.trained_role == "reward"
    if "reward" in present and (reward_trained or (stage is None and (roles["reward"] or {}).get("model"))):
        specs.append(_RoleSpec("reward", "classifier", reward_trained, model_config(recipe, "reward")))
    return specs


def _cuda_memory() -> int | None:
    try:
        return int(torch.cuda.get_device_properties(0).total_memory) if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001 - no usable CUDA device: the memory is unknown
        return None


def plan_memory(recipe: Mapping[str, Any], pools: Mapping[str, Any], device_memory: int | None = None) -> MemoryPlan:
    """The memory plan of a resolved recipe (a plain mapping) on its pools (``rlhfctl.recipe.pools.PoolInfo``).

    A role whose model cannot be built from its config here (a hub id that is not local, say) is listed
    in ``skipped`` with the reason instead.
    """
    plan = MemoryPlan(device_memory=device_memory, device_source="--device-memory" if device_memory else None)
    if device_memory is None and any(getattr(pool, "use_gpu", False) for pool in pools.values()):
        plan.device_memory = _cuda_memory()
        plan.device_source = "cuda" if plan.device_memory else None
    trainer, rollout = recipe.get("trainer") or {}, recipe.get("rollout") or {}
    samples = int(trainer.get("batch_size") or 16) * int(rollout.get("n") or 4)
    for spec in _role_specs(recipe):
        pool = next((pool for pool in pools.values() if spec.role in pool.roles), None)
        if pool is None:
            continue
        world = int(pool.world_size)
        try:
            plan.roles.append(_role_memory(recipe, spec, world, pool.name, math.ceil(samples / world)))
        except Exception as failure:  # noqa: BLE001 - reported per role; the rest of the plan still helps
            plan.skipped[spec.role] = f"{type(failure).__name__}: {failure}"
    return plan
