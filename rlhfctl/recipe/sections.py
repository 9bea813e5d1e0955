"""Read the sections of a resolved recipe that the role workers use, with their defaults filled in.

The recipe arrives as a plain dict (the whole resolved recipe). A validated recipe has every key; a
partial one (a test, a user's own script) gets the defaults of the one schema
(:mod:`rlhfctl.recipe.schema`): a missing key takes its schema default, and so does a ``null`` where the
schema does not allow one. Fallbacks between keys are :mod:`rlhfctl.recipe.resolve`'s; nothing else is
validated at this level.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from rlhfctl.recipe import schema
from rlhfctl.recipe.pools import DRIVER_POOL
from rlhfctl.recipe.resolve import TRAINER_FALLBACKS, role_setting, samples_per_rank, warmup_steps
from rlhfctl.recipe.schema import defaults_of, nullable_keys

__all__ = [
    "ACTOR_DEFAULTS",
    "CRITIC_DEFAULTS",
    "DEFAULT_INLINE_MODEL",
    "KL_DEFAULTS",
    "LORA_DEFAULTS",
    "MODEL_DEFAULTS",
    "OPTIM_DEFAULTS",
    "REFERENCE_DEFAULTS",
    "REWARD_DEFAULTS",
    "ROLLOUT_DEFAULTS",
    "SectionDefaults",
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


class SectionDefaults(dict):
    """The defaults of one schema section (:mod:`rlhfctl.recipe.schema`), with the keys whose null is a setting."""

    def __init__(self, section_cls: type) -> None:
        super().__init__(defaults_of(section_cls))
        self.nullable = nullable_keys(section_cls)


MODEL_DEFAULTS = SectionDefaults(schema.ModelConfig)
OPTIM_DEFAULTS = SectionDefaults(schema.OptimConfig)
LORA_DEFAULTS = SectionDefaults(schema.LoraConfig)
ACTOR_DEFAULTS = SectionDefaults(schema.ActorRole)
REFERENCE_DEFAULTS = SectionDefaults(schema.ReferenceRole)
CRITIC_DEFAULTS = SectionDefaults(schema.CriticRole)
REWARD_DEFAULTS = SectionDefaults(schema.RewardRole)
ROLLOUT_DEFAULTS = SectionDefaults(schema.RolloutConfig)
KL_DEFAULTS = SectionDefaults(schema.KLConfig)
TRAINER_DEFAULTS = SectionDefaults(schema.TrainerConfig)


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
    """``values`` with each missing key (or null where the schema allows no null) set to its default."""
    nullable = getattr(defaults, "nullable", frozenset())
    merged = dict(values)
    for key, default in defaults.items():
        if key not in merged or (merged[key] is None and key not in nullable):
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
    """``roles.<role>`` with ``defaults``; ``ppo_epochs``/``mini_batch_size`` as :func:`~rlhfctl.recipe.resolve.role_setting` resolves them."""
    config = _with_defaults(section(recipe, "roles", role), defaults)
    trainer = trainer_config(recipe)
    for key in TRAINER_FALLBACKS:
        if key in defaults:
            config[key] = role_setting(config, trainer, key)
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
    """``roles.<role>.optim`` with its defaults; ``warmup_steps`` as :func:`~rlhfctl.recipe.resolve.warmup_steps` resolves it."""
    optim = _with_defaults(section(recipe, "roles", role, "optim"), OPTIM_DEFAULTS)
    optim["warmup_steps"] = warmup_steps(section(recipe, "roles", role), optim)
    return optim


def uses_gpu(recipe: Mapping[str, Any], role: str) -> bool:
    """Whether ``role`` runs on CUDA: its pool's ``use_gpu``.

    The pool is ``roles.<role>.pool`` (``driver`` is the CPU); without one, a recipe with a single
    pool uses that pool, and otherwise the placement decides (a GPU assigned by Ray to this process).
    """
    pools = section(recipe, "resource_pools")
    name = section(recipe, "roles", role).get("pool")
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
