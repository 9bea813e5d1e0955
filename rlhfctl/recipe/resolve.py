"""The rules of the resolved recipe: each fallback and derived value, decided in one place.

A recipe key is declared, with its default, in :mod:`rlhfctl.recipe.schema`. What a key *means* once
the other keys are known is decided here and nowhere else:

- a role's ``ppo_epochs`` / ``mini_batch_size`` (null: the ``trainer`` value), :func:`role_setting`;
- who computes the reference log-probs (the reference role, the LoRA actor, or nobody),
  :func:`reference_source`;
- whether the step needs a separate old-log-prob pass, :func:`needs_old_log_probs`;
- the rows of one optimizer step on one rank, :func:`samples_per_rank`;
- a role's learning-rate warmup (``roles.critic.warmup_steps`` > 0 replaces ``optim.warmup_steps``),
  :func:`warmup_steps`;
- the dtype of a role's Hugging Face export (``trainer.export_dtype``, null: the role's compute dtype),
  :func:`export_dtype`;
- the rollout engine's dtype (``rollout.dtype``, null: the actor's compute dtype) and whether it is a precision
  apart from the actor's, :func:`rollout_dtype` and :func:`same_precision`.

:func:`rlhfctl.recipe.resolved.resolve` applies these rules once, building the typed, sealed
:class:`~rlhfctl.recipe.specs.Recipe` that validate, the trainer and the workers read. The functions take any
mapping with ``.get`` (an OmegaConf recipe, or a resolved section).
"""

from __future__ import annotations

import importlib
from typing import Any

from rlhfctl.recipe.specs import RoleUpdate, StepFacts
from rlhfctl.recipe.schema import ROLE_NAMES, FrozenDict

__all__ = [
    "ROLE_METHODS",
    "STRATEGIES",
    "TRAINER_FALLBACKS",
    "RoleUpdate",
    "export_dtype",
    "rollout_dtype",
    "same_precision",
    "needs_old_log_probs",
    "present_roles",
    "reference_source",
    "required_methods",
    "step_facts",
    "resolve_strategy",
    "role_setting",
    "role_update",
    "ROLLOUT_ROLE",
    "rollout_on_own_pool",
    "rollout_pool",
    "samples_per_rank",
    "TOKEN_SCORING_ROLES",
    "distills",
    "uses_kl",
    "warmup_steps",
]

#: Role keys whose null means "the trainer's value" (``roles.<role>.ppo_epochs: null`` -> ``trainer.ppo_epochs``).
TRAINER_FALLBACKS: tuple[str, ...] = ("ppo_epochs", "mini_batch_size")

#: The roles that take optimizer steps during a PPO step, in the order the step updates them.
UPDATING_ROLES: tuple[str, ...] = ("critic", "actor")


def present_roles(cfg: Any) -> list[str]:
    """Roles that are configured (not null), in the fixed order actor, reference, critic, reward."""
    roles = cfg.get("roles") or {}
    return [name for name in ROLE_NAMES if roles.get(name) is not None]


#: The name of the rollout worker group (``rollout.placement: separate``) in pool tables, traces and messages.
ROLLOUT_ROLE = "rollout"


def rollout_on_own_pool(rollout: Any) -> bool:
    """Whether a rollout worker group generates (``rollout.placement: separate``) rather than the actor's ranks: the
    one home of that decision, for a recipe's ``rollout`` section as a mapping or an OmegaConf node."""
    return (rollout.get("placement") or "colocated") == "separate"


def rollout_pool(cfg: Any) -> str | None:
    """The pool of the rollout worker group with ``rollout.placement: separate``; None when the actor generates."""
    rollout = cfg.get("rollout") or {}
    return rollout.get("pool") if rollout_on_own_pool(rollout) else None


def role_setting(role_section: Any, trainer_section: Any, key: str) -> Any:
    """A role's ``key``, or the trainer's when the role leaves it null (the one home of that fallback)."""
    value = role_section.get(key)
    return trainer_section.get(key) if value is None else value


def setting_key(cfg: Any, role: str, key: str) -> str:
    """The key path that supplies ``role``'s effective ``key`` (for messages): the role's own, or the trainer's."""
    own = cfg["roles"][role].get(key)
    return f"roles.{role}.{key}" if own is not None or key not in TRAINER_FALLBACKS else f"trainer.{key}"


def role_update(cfg: Any, role: str) -> RoleUpdate:
    """The effective epochs, mini- and micro-batch size of ``role`` (roles.<role>.<key>, else trainer.<key>)."""
    section, trainer = cfg["roles"][role], cfg["trainer"]
    micro = section.get("micro_batch_size")
    return RoleUpdate(
        role=role,
        ppo_epochs=int(role_setting(section, trainer, "ppo_epochs")),
        mini_batch_size=int(role_setting(section, trainer, "mini_batch_size")),
        micro_batch_size=None if micro is None else int(micro),
        mini_batch_key=setting_key(cfg, role, "mini_batch_size"),
    )


def reference_source(cfg: Any) -> str | None:
    """Who computes reference log-probs: "reference", "actor" (LoRA, adapter disabled) or None."""
    roles = cfg.get("roles") or {}
    if roles.get("reference") is not None:
        return "reference"
    actor = roles.get("actor")
    if actor is not None and actor.get("lora") is not None:
        return "actor"
    return None


def needs_old_log_probs(cfg: Any) -> bool:
    """True when the step needs a separate ``actor.compute_log_prob`` pass (several epochs or mini-batches, or in-reward KL).

    With one epoch over one mini-batch the policy has not moved when the loss is taken, so the
    detached current log-probs are the old ones. False without an actor (a reward_model stage): no policy to score.
    """
    if "actor" not in present_roles(cfg):
        return False
    actor = role_update(cfg, "actor")
    batch_size = int(cfg["trainer"]["batch_size"])
    return bool(actor.ppo_epochs > 1 or actor.mini_batch_size < batch_size or cfg["algorithm"]["kl"]["use_in_reward"]
                or distills(cfg))  # the distillation advantage reads the student's own log-probs on the driver


def distills(cfg: Any) -> bool:
    """Whether the step distills from ``roles.teacher``: the one home of that decision."""
    return (cfg.get("roles") or {}).get("teacher") is not None


STRATEGIES = ("fsdp2", "ddp")


def resolve_strategy(strategy: str | None, world_size: int) -> str:
    """The one home of the strategy default: ``fsdp2`` when the role has more than one rank, else ``ddp``."""
    if strategy is None:
        return "fsdp2" if int(world_size) > 1 else "ddp"
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose one of: {', '.join(STRATEGIES)}")
    return str(strategy)


def samples_per_rank(mini_batch_prompts: int | None, n: int, world_size: int, rows: int) -> int:
    """Rows of one optimizer step on one rank: ``mini_batch_size * n / world_size``, within [1, rows]."""
    if mini_batch_prompts is None:
        return rows
    share = int(mini_batch_prompts) * int(n) // int(world_size)
    return max(1, min(rows, share))


def warmup_steps(role_section: Any, optim_section: Any) -> int:
    """Learning-rate warmup of a role's optimizer: the role's own ``warmup_steps`` when > 0, else ``optim.warmup_steps``."""
    own = int(role_section.get("warmup_steps") or 0)
    return own if own > 0 else int(optim_section.get("warmup_steps") or 0)


def export_dtype(trainer_section: Any, compute_dtype: Any) -> Any:
    """The dtype of a trained role's Hugging Face weights (checkpoints' ``hf/``, ``export_hf``): ``trainer.export_dtype``,
    or the role's compute dtype (``model.dtype`` as the engine resolves it) when that is null or ``auto``.

    Not the float32 master precision by default: a bf16 role's export is half the size, and is what it computes in.
    """
    value = trainer_section.get("export_dtype")
    return compute_dtype if value in (None, "auto") else value


#: The precision each dtype name of a recipe means; ``auto`` computes in float32 (``rlhfctl.engine.placement``).
_PRECISION = {"float32": "float32", "fp32": "float32", "auto": "float32", "float16": "float16", "fp16": "float16",
              "half": "float16", "bfloat16": "bfloat16", "bf16": "bfloat16"}


def rollout_dtype(rollout_section: Any, actor_dtype: Any) -> str:
    """The dtype the rollout engine samples in: ``rollout.dtype``, or the actor's compute dtype when it is null."""
    value = rollout_section.get("dtype")
    return str(actor_dtype if value is None else value)


def same_precision(dtype: Any, other: Any) -> bool:
    """Whether two recipe dtype names compute alike (``bf16`` and ``bfloat16`` do; ``auto`` is float32)."""
    return _PRECISION.get(str(dtype).lower(), str(dtype)) == _PRECISION.get(str(other).lower(), str(other))


def step_facts(cfg: Any) -> StepFacts:
    """What a PPO-family recipe means for one training step (see the module docstring for what is decided here)."""
    roles = tuple(present_roles(cfg))
    kl = cfg["algorithm"]["kl"]
    source = reference_source(cfg)
    prompts = int(cfg["trainer"]["batch_size"])
    updating = [role for role in UPDATING_ROLES if role in roles]
    pools = {role: str(cfg["roles"][role].get("pool")) for role in updating}
    return StepFacts(
        roles=roles,
        reference_source=source,
        needs_old_log_probs=needs_old_log_probs(cfg),
        updates=FrozenDict({role: role_update(cfg, role) for role in updating}),
        prompts_per_step=prompts,
        samples_per_step=prompts * int(cfg["rollout"]["n"]),
        kl_in_reward=bool(kl["use_in_reward"]) and source is not None,
        kl_loss=bool(kl["use_kl_loss"]) and source is not None,
        greedy_baseline=cfg["algorithm"]["adv_estimator"] == "remax",
        critic_warmup_steps=int(cfg["trainer"]["critic_warmup_steps"]),
        # Roles on separate pools update at once; colocated ones share a process and run in turn.
        parallel_updates=len(set(pools.values())) == len(updating) == 2,
        distillation=distills(cfg),
        behaviour_loss="actor" in roles and _takes_behaviour(str(cfg["roles"]["actor"]["policy_loss"]),
                                                             list(cfg["algorithm"]["import_modules"] or [])),
    )


def _takes_behaviour(policy_loss: str, import_modules: list[str]) -> bool:
    """Whether the actor's loss takes behaviour log-probs: the loss registry's own rule, after the recipe's
    ``algorithm.import_modules`` registered their losses (one that fails to import is validate's to name)."""
    # torch-heavy: imported here so loading a recipe stays off torch until a step is resolved.
    from rlhfctl.algorithms.policy_losses import policy_loss_takes_behaviour

    for module in import_modules:
        try:
            importlib.import_module(module)
        except Exception:  # noqa: BLE001 - check_algorithm reports the import error with its key path
            pass
    try:
        return bool(policy_loss_takes_behaviour(policy_loss))
    except (KeyError, ValueError):  # an unknown loss: check_algorithm names it
        return False


#: Registered methods the trainer calls on each role's worker group.
ROLE_METHODS: dict[str, tuple[str, ...]] = {
    "actor": ("init_model", "generate_sequences", "compute_log_prob", "update_actor"),
    "reference": ("compute_ref_log_prob",),
    "critic": ("init_model", "compute_values", "update_critic"),
    "reward": ("compute_rewards",),
    "teacher": ("init_model", "compute_teacher_log_prob"),
    ROLLOUT_ROLE: ("init_model", "join_weight_sync", "receive_weights", "generate_sequences", "sync_probe"),  # placement: separate
}


#: Frozen roles that score every sampled token behind generation, for the driver: role -> (method, the column it
#: returns). A role listed here is sent each rollout with the reference and joined before the advantages; adding one
#: is this entry, a schema section and a worker class. (The reference is apart: its column may join on the actor.)
TOKEN_SCORING_ROLES: dict[str, tuple[str, str]] = {
    "teacher": ("compute_teacher_log_prob", "teacher_log_prob"),
}


def uses_kl(cfg: Any) -> bool:
    """True when the KL to the reference enters the reward or the loss."""
    kl = cfg.algorithm.kl
    return bool(kl.use_in_reward or kl.use_kl_loss)


def required_methods(cfg: Any, role: str) -> tuple[str, ...]:
    """Registered methods ``role``'s worker class needs for this recipe (the actor also serves as reference with LoRA)."""
    methods = ROLE_METHODS[role]
    if role == "actor" and reference_source(cfg) == "actor":
        methods = (*methods, "compute_ref_log_prob")
    if role == "actor" and rollout_pool(cfg) is not None:  # the sender's end of the weight channel
        methods = (*methods, "open_weight_sync", "join_weight_sync", "send_weights", "check_weight_sync")
    return methods
