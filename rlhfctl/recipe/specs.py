"""The resolved recipe's types: one typed, read-only object that validate, the trainer and every worker read.

:func:`rlhfctl.recipe.resolved.resolve` builds a :class:`Recipe` once from the OmegaConf tree a user writes and
overrides; nothing after it reads that tree. Each role is a :class:`RoleSpec` (its model, optimizer, update, pool,
strategy and dtype, every fallback filled in), the rollout a :class:`RolloutSpec`, and the step's facts (who
computes the reference log-probs, whether old log-probs are needed, which loss takes behaviour log-probs) a
:class:`StepFacts`. The sections themselves are the schema's dataclasses (:mod:`rlhfctl.recipe.schema`), sealed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlhfctl.recipe.schema import (
    AlgorithmConfig,
    DataConfig,
    ModelConfig,
    MultiTurnConfig,
    OptimConfig,
    RayConfig,
    RecipeSchema,
    ResourcePoolConfig,
    RolloutConfig,
    Section,
    TrainerConfig,
    VllmRolloutConfig,
)

if TYPE_CHECKING:
    from rlhfctl.environments.choice import EnvironmentChoice
    from rlhfctl.recipe.pools import PoolInfo

__all__ = ["Recipe", "RoleSpec", "RoleUpdate", "RolloutSpec", "StepFacts"]


@dataclass(frozen=True)
class RoleUpdate:
    """How an updating role (actor, critic) trains on a step's batch, fallbacks filled in."""

    role: str
    ppo_epochs: int
    mini_batch_size: int
    micro_batch_size: int | None
    mini_batch_key: str


@dataclass(frozen=True)
class RoleSpec:
    """One configured role: what its workers build and where they run, every fallback decided.

    ``settings`` is the role's section with ``ppo_epochs`` / ``mini_batch_size`` resolved (null: the trainer's);
    ``model`` is its own model or the one it falls back to (the actor's, for a reference or critic without one),
    with the default inline architecture where neither ``path`` nor ``config`` is given (None: a reward function);
    ``optim`` has its warmup resolved (None: a role without an optimizer).
    """

    name: str
    settings: Section
    worker: str
    pool: str
    use_gpu: bool
    world_size: int | None
    strategy: str | None
    model: ModelConfig | None
    optim: OptimConfig | None
    update: RoleUpdate | None
    methods: tuple[str, ...] = ()
    """The registered methods the trainer calls on the role's worker group (a LoRA actor's reference pass and the
    weight channel's sender end included)."""

    @property
    def dtype(self) -> str | None:
        """The role's compute dtype (``model.dtype``); None for a reward function."""
        return None if self.model is None else str(self.model.dtype)


@dataclass(frozen=True)
class RolloutSpec:
    """Who generates, on which engine and how the weights reach it (``rollout`` and ``trainer.max_staleness``).

    ``settings`` is the rollout section the workers read: with ``rollout.environment``, its ``multi_turn`` is on and
    runs that environment (``rlhfctl/environments/choice.py``); ``multi_turn``, ``agent`` and ``response_width`` follow it.
    """

    settings: RolloutConfig
    placement: str
    on_own_pool: bool
    pool: str | None
    engine: str
    worker: str
    vllm: VllmRolloutConfig
    multi_turn: MultiTurnConfig
    agent: bool
    response_width: int
    sync_every: int
    max_staleness: int
    environment: EnvironmentChoice | None = None
    """What ``rollout.environment`` names (None: unset); with it usable, ``settings.multi_turn`` runs its adapter."""
    dtype: str = "float32"
    """The engine's dtype: ``rollout.dtype``, or the actor's compute dtype (``roles.actor.model.dtype``) when null."""
    own_precision: bool = False
    """``dtype`` computes apart from the actor's compute dtype: the engine's log-probs differ from the trainer's."""

    @property
    def engine_log_probs(self) -> bool:
        """The engine returns its own behaviour log-probs (``rollout_log_probs``) beside the samples: a vLLM engine, a
        rollout group of its own, or an hf engine in a precision of its own (for ``rollout/logprob_diff`` and the
        off-policy corrections) or partial rollouts (a carried sample's earlier tokens are an older policy's); the
        colocated hf engine in the actor's precision samples what the actor scores."""
        return self.engine == "vllm" or self.on_own_pool or self.own_precision or self.partial_budget is not None

    @property
    def partial_budget(self) -> int | None:
        """``rollout.partial.max_tokens_per_step``: the token budget of a sample in one step (None: partial rollouts off)."""
        budget = self.settings.partial.max_tokens_per_step
        return None if budget is None else int(budget)


@dataclass(frozen=True)
class StepFacts:
    """What a validated PPO recipe means for one training step: the values the step and its workers use."""

    roles: tuple[str, ...]
    reference_source: str | None
    needs_old_log_probs: bool
    updates: Mapping[str, RoleUpdate]
    prompts_per_step: int
    samples_per_step: int
    kl_in_reward: bool
    kl_loss: bool
    greedy_baseline: bool
    critic_warmup_steps: int
    parallel_updates: bool
    behaviour_loss: bool
    distillation: bool = False
    """``roles.teacher`` is set: the advantage takes ``algorithm.distillation``'s per-token reverse-KL term."""

    @property
    def has_critic(self) -> bool:
        """A critic role is configured (values in, a value-loss update out)."""
        return "critic" in self.roles

    def updates_actor(self, step: int) -> bool:
        """Whether step ``step`` (from 1) updates the actor: not during ``trainer.critic_warmup_steps``."""
        return step > self.critic_warmup_steps


@dataclass(frozen=True)
class Recipe:
    """The resolved recipe (see the module docstring): built by ``resolve``, read by everything after it."""

    sections: RecipeSchema
    roles: Mapping[str, RoleSpec]
    rollout: RolloutSpec
    pools: Mapping[str, PoolInfo]
    step: StepFacts
    stage: str | None

    @property
    def trainer(self) -> TrainerConfig:
        """``trainer``, sealed."""
        return self.sections.trainer

    @property
    def data(self) -> DataConfig:
        """``data``, sealed."""
        return self.sections.data

    @property
    def algorithm(self) -> AlgorithmConfig:
        """``algorithm``, sealed."""
        return self.sections.algorithm

    @property
    def ray(self) -> RayConfig:
        """``ray``, sealed."""
        return self.sections.ray

    @property
    def resource_pools(self) -> Mapping[str, ResourcePoolConfig]:
        """``resource_pools`` as the recipe declares them, sealed (:attr:`pools` adds the roles on each)."""
        return self.sections.resource_pools

    def __getitem__(self, key: str) -> Any:
        """A section as written (``recipe["trainer"]["output_dir"]``): a worker written for the mapping workers used to
        receive reads the same values from the resolved recipe."""
        return self.sections[key]

    def get(self, key: str, default: Any = None) -> Any:
        """A section as written, or ``default`` (see :meth:`__getitem__`)."""
        return self.sections.get(key, default)

    def role(self, name: str) -> RoleSpec:
        """The spec of role ``name``; a clear error when the recipe does not configure it."""
        try:
            return self.roles[name]
        except KeyError:
            raise KeyError(f"roles.{name} is not configured (configured: {', '.join(self.roles) or 'none'})") from None

    def has(self, name: str) -> bool:
        """Whether role ``name`` is configured."""
        return name in self.roles

    def section_of(self, name: str) -> Any:
        """The role's raw section as written (null fallbacks unresolved), for messages that quote the recipe."""
        return getattr(self.sections.roles, name)
