"""Resolve a recipe once: the OmegaConf tree a user writes and overrides becomes the typed, sealed
:class:`~rlhfctl.recipe.specs.Recipe` that validate, the trainer and the workers read.

The rules each value follows live in :mod:`rlhfctl.recipe.resolve`; this module applies them all, in one pass.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rlhfctl.agents.trajectory import response_width
from rlhfctl.environments.choice import effective_rollout, environment_choice
from rlhfctl.recipe.load import merged_over_schema
from rlhfctl.recipe.pools import PoolInfo, resolve_pools
from rlhfctl.recipe.resolve import (
    TRAINER_FALLBACKS,
    UPDATING_ROLES,
    present_roles,
    required_methods,
    resolve_strategy,
    role_setting,
    rollout_dtype,
    rollout_on_own_pool,
    same_precision,
    step_facts,
    warmup_steps,
)
from rlhfctl.recipe.schema import ROLE_NAMES, FrozenDict, ModelConfig, RecipeSchema, RolloutConfig, Section, nullable_keys, sealed
from rlhfctl.recipe.specs import Recipe, RoleSpec, RoleUpdate, RolloutSpec
from rlhfctl.recipe.stages import is_stage

__all__ = ["DEFAULT_INLINE_MODEL", "MODEL_FALLBACKS", "resolve", "resolve_mapping"]


#: The inline architecture of a role that gives neither ``model.path`` nor ``model.config``.
DEFAULT_INLINE_MODEL: dict[str, Any] = {
    "model_type": "qwen2",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "max_position_embeddings": 512,
}

#: Roles whose null ``model`` means the actor's (the critic adds a value head to it).
MODEL_FALLBACKS: dict[str, str] = {"reference": "actor", "critic": "actor"}


def resolve(cfg: Any) -> Recipe:
    """The resolved recipe of a loaded recipe (an OmegaConf tree, checked): typed, sealed, every fallback decided.

    Called once, where a recipe is loaded; validate, the trainer and the workers read what it returns.
    """
    sections: RecipeSchema = OmegaConf.to_object(cfg) if isinstance(cfg, DictConfig) else cfg  # type: ignore[assignment]
    pools = resolve_pools(cfg, strict=False)
    rollout = _rollout_spec(sections)
    roles = {name: _role_spec(sections, name, pools, rollout.settings) for name in present_roles(cfg)}
    stage = str(sections.algorithm.name) if is_stage(cfg) else None
    recipe = Recipe(
        sections=sections,
        roles=FrozenDict(roles),
        rollout=rollout,
        pools=FrozenDict(pools),
        step=step_facts(cfg),
        stage=stage,
    )
    sections.seal()
    sealed(rollout.settings)  # rollout.environment's effective section is a copy of the one sealed above
    for spec in roles.values():
        sealed(spec.settings), sealed(spec.model), sealed(spec.optim)
    return recipe


def resolve_mapping(data: Mapping[str, Any], role: str | None = None) -> Recipe:
    """The resolved recipe of plain recipe data (a test's or a script's dict, maybe partial): the schema's defaults,
    then :func:`resolve`. Only types are checked; ``validate`` checks whole recipes."""
    plain = _plain(data, RecipeSchema)
    if role in ROLE_NAMES and (plain.get("roles") or {}).get(role) is None:  # a worker built for a role the data leaves out
        plain.setdefault("roles", {})[role] = {}
    cfg = merged_over_schema(plain)
    OmegaConf.resolve(cfg)
    return resolve(cfg)


def _plain(value: Any, schema: Any = None) -> Any:
    """``value`` as plain dicts and lists; under a schema section, a null where the schema allows none is dropped
    (that key takes its default, as a partial recipe means)."""
    if isinstance(value, Mapping):
        hints = typing.get_type_hints(schema) if isinstance(schema, type) and issubclass(schema, Section) else {}
        nullable = nullable_keys(schema) if hints else frozenset()
        return {str(key): _plain(item, _section_type(hints.get(str(key)))) for key, item in value.items()
                if not (hints and item is None and str(key) in hints and str(key) not in nullable)}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def _section_type(hint: Any) -> Any:
    """The schema section a field holds (``Optional[ActorRole]`` -> ActorRole), else None."""
    for candidate in (hint, *typing.get_args(hint)):
        if isinstance(candidate, type) and issubclass(candidate, Section):
            return candidate
    return None


def _role_spec(sections: RecipeSchema, name: str, pools: Mapping[str, PoolInfo], rollout: RolloutConfig) -> RoleSpec:
    section = getattr(sections.roles, name)
    trainer = sections.trainer
    fallbacks = {key: role_setting(section, trainer, key) for key in TRAINER_FALLBACKS if key in section}
    if "loss_scale_factor" in section and section.loss_scale_factor is None:  # seq-mean-token-sum-norm's constant
        fallbacks["loss_scale_factor"] = response_width(rollout)
    settings = dataclasses.replace(section, **fallbacks) if fallbacks else section
    model = section.get("model")
    fallback = getattr(sections.roles, MODEL_FALLBACKS[name]) if name in MODEL_FALLBACKS else None
    if model is None and fallback is not None:  # a reward_model stage has no actor to fall back to
        model = fallback.model
    if model is None and name == "reward" and str(sections.algorithm.name) == "reward_model":
        model = ModelConfig()  # the reward model being trained: the default inline architecture below
    if model is not None and model.path in (None, "") and model.config is None:
        model = dataclasses.replace(model, config=dict(DEFAULT_INLINE_MODEL))
    optim = section.get("optim")
    if optim is not None:
        optim = dataclasses.replace(optim, warmup_steps=warmup_steps(section, optim))
    pool = str(section.pool)
    info = pools.get(pool)
    world = None if info is None or info.in_driver else info.world_size
    updating = name in UPDATING_ROLES
    return RoleSpec(
        name=name,
        settings=settings,
        worker=str(section.worker),
        pool=pool,
        use_gpu=bool(info.use_gpu) if info is not None else False,
        world_size=world,
        strategy=None if world is None else resolve_strategy(section.get("strategy"), world),
        model=model,
        optim=optim,
        update=_role_update(sections, name, settings) if updating else None,
        methods=required_methods(sections, name),
    )


def _role_update(sections: RecipeSchema, name: str, settings: Any) -> RoleUpdate:
    micro = settings.get("micro_batch_size")
    own = getattr(sections.roles, name).get("mini_batch_size")
    return RoleUpdate(
        role=name,
        ppo_epochs=int(settings.ppo_epochs),
        mini_batch_size=int(settings.mini_batch_size),
        micro_batch_size=None if micro is None else int(micro),
        mini_batch_key=f"roles.{name}.mini_batch_size" if own is not None else "trainer.mini_batch_size",
    )


def _rollout_spec(sections: RecipeSchema) -> RolloutSpec:
    choice = environment_choice(sections.rollout)
    rollout = effective_rollout(sections.rollout, choice)  # rollout.environment runs as the multi-turn environment
    own_pool = rollout_on_own_pool(rollout)
    actor = sections.roles.get("actor")
    actor_dtype = actor.model.dtype if actor is not None and actor.get("model") is not None else ModelConfig.dtype
    dtype = rollout_dtype(rollout, actor_dtype)
    return RolloutSpec(
        settings=rollout,
        placement=str(rollout.placement),
        on_own_pool=own_pool,
        pool=str(rollout.pool) if own_pool and rollout.pool is not None else None,
        engine=str(rollout.engine),
        worker=str(rollout.worker),
        vllm=rollout.vllm,
        multi_turn=rollout.multi_turn,
        agent=bool(rollout.multi_turn.enable),
        response_width=response_width(rollout),
        sync_every=int(rollout.sync_every),
        max_staleness=int(sections.trainer.max_staleness),
        environment=choice,
        dtype=dtype,
        own_precision=not same_precision(dtype, actor_dtype),
    )
