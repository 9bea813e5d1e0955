"""Read the sections of a resolved recipe that the role workers use, with their defaults filled in.

The recipe arrives as a plain dict (the whole resolved recipe). A key that is missing, or set to
``null``, takes the default listed here; nothing else is validated at this level.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from rlhfctl.recipe.pools import DRIVER_POOL

__all__ = [
    "ACTOR_DEFAULTS",
    "CRITIC_DEFAULTS",
    "DEFAULT_INLINE_MODEL",
    "KL_DEFAULTS",
    "LORA_DEFAULTS",
    "MODEL_DEFAULTS",
    "OPTIM_DEFAULTS",
    "REWARD_DEFAULTS",
    "ROLLOUT_DEFAULTS",
    "TRAINER_DEFAULTS",
    "kl_config",
    "model_config",
    "optim_config",
    "plain",
    "role_config",
    "rollout_config",
    "samples_per_rank",
    "section",
    "trainer_config",
    "uses_gpu",
]

DEFAULT_INLINE_MODEL: dict[str, Any] = {
    "model_type": "qwen2",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "max_position_embeddings": 512,
}
MODEL_DEFAULTS: dict[str, Any] = {
    "path": None,
    "config": None,
    "tokenizer_path": None,
    "dtype": "float32",
    "trust_remote_code": False,
    "gradient_checkpointing": False,
}
OPTIM_DEFAULTS: dict[str, Any] = {
    "lr": 1e-4,
    "weight_decay": 0.0,
    "betas": [0.9, 0.999],
    "eps": 1e-8,
    "grad_clip": 1.0,
    "lr_schedule": "constant",
    "warmup_steps": 0,
    "min_lr_ratio": 0.0,
}
LORA_DEFAULTS: dict[str, Any] = {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": "all-linear"}
ACTOR_DEFAULTS: dict[str, Any] = {
    "ppo_epochs": None,
    "mini_batch_size": None,
    "micro_batch_size": None,
    "clip_ratio_low": 0.2,
    "clip_ratio_high": 0.2,
    "clip_ratio_c": 3.0,
    "entropy_coeff": 0.0,
    "loss_agg_mode": "token-mean",
    "lora": None,
}
CRITIC_DEFAULTS: dict[str, Any] = {
    "ppo_epochs": None,
    "mini_batch_size": None,
    "micro_batch_size": None,
    "cliprange_value": 0.5,
    "loss_agg_mode": "token-mean",
}
REWARD_DEFAULTS: dict[str, Any] = {"function": None, "model": None, "batch_size": None, "on_error": "raise"}
ROLLOUT_DEFAULTS: dict[str, Any] = {
    "n": 4,
    "max_new_tokens": 32,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "do_sample": True,
    "engine": "hf",
}
KL_DEFAULTS: dict[str, Any] = {"use_kl_loss": False, "loss_coef": 0.001, "loss_kind": "k3"}
TRAINER_DEFAULTS: dict[str, Any] = {
    "seed": 0,
    "total_steps": None,
    "ppo_epochs": 1,
    "mini_batch_size": None,
    "batch_size": None,
}


def plain(value: Any) -> Any:
    """Deep-copy mappings and sequences (OmegaConf containers included) into dicts and lists."""
    if isinstance(value, Mapping):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [plain(item) for item in value]
    return copy.copy(value)


def section(recipe: Mapping[str, Any], *path: str) -> dict[str, Any]:
    """The mapping at ``recipe[path[0]][path[1]]...``; an absent or null section gives ``{}``."""
    node: Any = recipe
    for key in path:
        if not isinstance(node, Mapping):
            return {}
        node = node.get(key)
    return dict(node) if isinstance(node, Mapping) else {}


def _with_defaults(values: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(values)
    for key, default in defaults.items():
        if merged.get(key) is None:
            merged[key] = copy.deepcopy(default)
    return merged


def trainer_config(recipe: Mapping[str, Any]) -> dict[str, Any]:
    """``trainer`` with its defaults."""
    return _with_defaults(section(recipe, "trainer"), TRAINER_DEFAULTS)


def rollout_config(recipe: Mapping[str, Any]) -> dict[str, Any]:
    """``rollout`` with its defaults."""
    return _with_defaults(section(recipe, "rollout"), ROLLOUT_DEFAULTS)


def kl_config(recipe: Mapping[str, Any]) -> dict[str, Any]:
    """``algorithm.kl`` with its defaults (``kind`` is accepted as an alias of ``loss_kind``)."""
    kl = section(recipe, "algorithm", "kl")
    if kl.get("loss_kind") is None and kl.get("kind") is not None:
        kl["loss_kind"] = kl["kind"]
    return _with_defaults(kl, KL_DEFAULTS)


def role_config(recipe: Mapping[str, Any], role: str, defaults: Mapping[str, Any]) -> dict[str, Any]:
    """``roles.<role>`` with ``defaults``; ``ppo_epochs``/``mini_batch_size`` fall back to ``trainer``."""
    config = _with_defaults(section(recipe, "roles", role), defaults)
    trainer = trainer_config(recipe)
    for key in ("ppo_epochs", "mini_batch_size"):
        if key in defaults and config.get(key) is None:
            config[key] = trainer.get(key)
    return config


def model_config(recipe: Mapping[str, Any], role: str, fallback: str | None = None) -> dict[str, Any]:
    """``roles.<role>.model`` (or ``roles.<fallback>.model`` when it is null) with its defaults.

    With neither ``path`` nor ``config``, the small default inline architecture is used.
    """
    model = section(recipe, "roles", role, "model")
    if not model and fallback is not None:
        model = section(recipe, "roles", fallback, "model")
    model = _with_defaults(model, MODEL_DEFAULTS)
    if model.get("path") in (None, "") and model.get("config") is None:
        model["config"] = dict(DEFAULT_INLINE_MODEL)
    return model


def optim_config(recipe: Mapping[str, Any], role: str) -> dict[str, Any]:
    """``roles.<role>.optim`` with its defaults."""
    return _with_defaults(section(recipe, "roles", role, "optim"), OPTIM_DEFAULTS)


def samples_per_rank(mini_batch_prompts: int | None, n: int, world_size: int, rows: int) -> int:
    """Rows of one optimizer step on one rank: ``mini_batch_size * n / world_size``, within [1, rows]."""
    if mini_batch_prompts is None:
        return rows
    share = int(mini_batch_prompts) * int(n) // int(world_size)
    return max(1, min(rows, share))


def uses_gpu(recipe: Mapping[str, Any], role: str) -> bool:
    """Whether ``role`` runs on CUDA: its pool's ``use_gpu``.

    The pool is ``roles.<role>.pool`` (or ``resource_pool``; ``driver`` is the CPU); without one, a recipe with a single
    pool uses that pool, and otherwise the placement decides (a GPU assigned by Ray to this process).
    """
    pools = section(recipe, "resource_pools")
    role_section = section(recipe, "roles", role)
    name = role_section.get("pool") or role_section.get("resource_pool")
    if name == DRIVER_POOL:  # a reward function run in the driver process, on its CPU
        return False
    if name is not None:
        if name not in pools:
            raise ValueError(
                f"roles.{role} names resource pool {name!r}, but resource_pools defines {sorted(pools) or 'none'}"
            )
        return bool((pools[name] or {}).get("use_gpu", False))
    flags = {bool((pool or {}).get("use_gpu", False)) for pool in pools.values()}
    if len(flags) == 1:
        return flags.pop()
    if not flags:
        return False
    return _ray_assigned_gpu()


def _ray_assigned_gpu() -> bool:
    try:
        import ray

        return ray.is_initialized() and bool(ray.get_gpu_ids())
    except Exception:  # noqa: BLE001 - not inside Ray: no GPU was assigned
        return False
