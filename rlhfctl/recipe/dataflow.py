"""The group calls of one training step, in order, with the batch keys each one reads and writes.

This is the plan ``rlhfctl inspect-dispatch`` and ``rlhfctl validate`` describe; the trainer follows the
same order. Tensor names follow the usual PPO batch keys; shapes use symbolic dimensions resolved by
:func:`resolve_dims`: ``rows`` (rows on one rank), ``prompt_len`` (data.max_prompt_length),
``response_len`` (rollout.max_new_tokens) and ``seq_len`` (their sum).

With ``rollout.placement: separate`` the rollout group (role ``rollout``) generates, and a weight sync
(unit ``weights``: no batch rows) follows the actor's update.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlhfctl.recipe.check_tensor_parallel import engines_line
from rlhfctl.recipe.off_policy import actor_update_note
from rlhfctl.recipe.resolve import ROLLOUT_ROLE, TOKEN_SCORING_ROLES
from rlhfctl.recipe.specs import Recipe, StepFacts

__all__ = ["StepCall", "TensorSpec", "resolve_dims", "training_step"]


@dataclass(frozen=True)
class TensorSpec:
    """A batch key with symbolic dims and a dtype."""

    name: str
    dims: tuple[str, ...]
    dtype: str


@dataclass(frozen=True)
class StepCall:
    """One call of a training step: a worker-group method, or work done on the driver (role "driver")."""

    role: str
    method: str
    purpose: str
    unit: str
    inputs: tuple[TensorSpec, ...] = ()
    outputs: tuple[TensorSpec, ...] = ()
    fan_out: int = 1
    updates: bool = False
    note: str = ""

    @property
    def carries_rows(self) -> bool:
        """True for calls over the batch's prompts or samples (not a weight sync)."""
        return self.unit in ("prompts", "samples")

    @property
    def name(self) -> str:
        """``role.method`` (``driver: method`` for driver work)."""
        return f"driver: {self.method}" if self.role == "driver" else f"{self.role}.{self.method}"


def _t(name: str, dims: str, dtype: str) -> TensorSpec:
    return TensorSpec(name, tuple(dims.split()), dtype)


_PROMPT_IN = (_t("input_ids", "rows prompt_len", "int64"), _t("attention_mask", "rows prompt_len", "int64"), _t("position_ids", "rows prompt_len", "int64"))
_SEQUENCE = (_t("input_ids", "rows seq_len", "int64"), _t("attention_mask", "rows seq_len", "int64"), _t("position_ids", "rows seq_len", "int64"), _t("responses", "rows response_len", "int64"))
_MASK = _t("response_mask", "rows response_len", "int64")


def _f(name: str) -> TensorSpec:
    return _t(name, "rows response_len", "float32")


def _scoring(step: StepFacts) -> list[StepCall]:
    """Reward, reference log-probs and values: independent calls the trainer keeps in flight together."""
    calls = [StepCall("reward", "compute_rewards", "score the responses", "samples",
                      (_t("prompts", "rows prompt_len", "int64"), _t("responses", "rows response_len", "int64"), _MASK),
                      (_f("token_level_scores"),))] if "reward" in step.roles else []  # none: distillation alone
    reference = step.reference_source
    if reference is not None:
        note = "the actor with its LoRA adapter disabled" if reference == "actor" else ""
        calls.append(StepCall(reference, "compute_ref_log_prob", "reference log-probs for the KL", "samples",
                              _SEQUENCE, (_f("ref_log_prob"),), note=note))
    if step.has_critic:
        calls.append(StepCall("critic", "compute_values", "value estimates", "samples", _SEQUENCE, (_f("values"),)))
    for role, (method, column) in TOKEN_SCORING_ROLES.items():
        if role in step.roles:
            calls.append(StepCall(role, method, f"{role} log-probs of the sampled tokens", "samples", _SEQUENCE, (_f(column),)))
    return calls


def _driver(recipe: Recipe) -> list[StepCall]:
    """KL-shaped rewards (optional) and advantages, computed on the driver."""
    step, kl = recipe.step, recipe.algorithm.kl
    calls = []
    if step.kl_in_reward:
        calls.append(StepCall("driver", "apply_kl_penalty", f"token rewards = scores - coef * KL ({kl.kind}, {kl.controller})",
                              "samples", (_f("token_level_scores"), _f("old_log_probs"), _f("ref_log_prob")),
                              (_f("token_level_rewards"),)))
    estimator = recipe.algorithm.adv_estimator
    inputs = [_f("token_level_rewards"), _MASK] + ([_f("values")] if step.has_critic else [])
    calls.append(StepCall("driver", "compute_advantages", f"advantages ({estimator})", "samples", tuple(inputs),
                          (_f("advantages"), _f("returns"))))
    if step.distillation:
        distill = recipe.algorithm.distillation
        calls.append(StepCall("driver", "distillation_advantages",
                              f"advantages = {distill.mix:g} x task - {distill.coef:g} x (student - teacher log-prob)", "samples",
                              (_f("advantages"), _f("old_log_probs"), _f("teacher_log_prob"), _MASK),
                              (_f("advantages"), _f("reverse_kl"))))
    return calls


def _actor_update(step: StepFacts, vllm: bool, separate: bool, engine_log_probs: bool, policy_note: str) -> StepCall:
    """The policy update, with the optional inputs this recipe gives it (the engine's log-probs where the engine returns
    them: ``RolloutSpec.engine_log_probs``)."""
    actor_inputs = [*_SEQUENCE, _MASK, _f("advantages")]
    if step.needs_old_log_probs:
        actor_inputs.append(_f("old_log_probs"))
    if step.kl_loss:
        actor_inputs.append(_f("ref_log_prob"))
    if engine_log_probs:
        actor_inputs.append(_f("rollout_log_probs"))
    note = policy_note  # on- or off-policy (rlhfctl.recipe.off_policy)
    if vllm and not separate:
        note = _joined(note, "then the new weights go into this rank's vLLM engine (time/rollout_sync)")
    warmup = step.critic_warmup_steps
    if warmup:
        note = _joined(note, f"skipped during the first {warmup} step(s) (trainer.critic_warmup_steps)")
    return StepCall("actor", "update_actor", "PPO policy update", "samples", tuple(actor_inputs), updates=True, note=note)


def training_step(recipe: Recipe) -> list[StepCall]:
    """The calls of one training step for this recipe, in the order the trainer makes them.

    The conditions (which roles score, whether there is an old-log-prob pass, ...) are the
    :class:`~rlhfctl.recipe.specs.StepFacts` fields the trainer reads too.
    """
    step, rollout = recipe.step, recipe.rollout
    n = int(rollout.settings.n)
    generated = (_t("prompts", "rows prompt_len", "int64"), _t("responses", "rows response_len", "int64"), _MASK,
                 _t("input_ids", "rows seq_len", "int64"), _t("attention_mask", "rows seq_len", "int64"),
                 _t("position_ids", "rows seq_len", "int64"))
    vllm = rollout.engine == "vllm"
    pool = rollout.pool
    if rollout.engine_log_probs:  # the engine's own log-probs come back too, for rollout/logprob_diff, rollout.importance_cap and importance_mask
        generated += (_f("rollout_log_probs"),)
    generator = "actor" if pool is None else ROLLOUT_ROLE
    steps = [StepCall(generator, "generate_sequences", f"sample {n} response(s) per prompt", "prompts", _PROMPT_IN,
                      generated, fan_out=n, note=_joined(_engine_note(recipe, vllm, pool), _dynamic_sampling_note(recipe, pool),
                                                         _partial_note(recipe)))]
    steps += _scoring(step)
    if step.needs_old_log_probs:
        steps.append(StepCall("actor", "compute_log_prob", "log-probs of the sampled tokens before the update",
                              "samples", _SEQUENCE, (_f("old_log_probs"), _f("entropys"))))
    if step.greedy_baseline:
        steps.append(StepCall(generator, "generate_sequences", "greedy response per prompt (ReMax baseline)", "prompts",
                              _PROMPT_IN, generated, note="meta_info do_sample=false, n=1"))
        steps.append(StepCall("reward", "compute_rewards", "score the greedy baseline", "prompts",
                              generated[:3], (_f("token_level_scores"),)))
    steps += _driver(recipe)
    if step.has_critic:
        steps.append(StepCall("critic", "update_critic", "value-loss update", "samples",
                              (*_SEQUENCE, _MASK, _f("values"), _f("returns")), updates=True))
    steps.append(_actor_update(step, vllm, pool is not None, rollout.engine_log_probs, actor_update_note(recipe)))
    if pool is not None:
        steps += _weight_sync(rollout.sync_every)
    return steps


def _engine_note(recipe: Recipe, vllm: bool, pool: str | None) -> str:
    """Where the responses are sampled (the actor's ranks, or the rollout group's engine replicas), and in which
    dtype when ``rollout.dtype`` sets one apart from the actor's."""
    where = _engine_place(recipe, vllm, pool)
    if not recipe.rollout.own_precision:
        return where
    return f"{where}; sampled in {recipe.rollout.dtype} (rollout.dtype), behaviour log-probs returned"


def _engine_place(recipe: Recipe, vllm: bool, pool: str | None) -> str:
    """Where the responses are sampled: the actor's ranks, or the rollout group's engine replicas."""
    if pool is not None:
        chunks = int(recipe.rollout.settings.stream_chunks)
        streamed = f"; in {chunks} calls, each scored as it finishes (rollout.stream_chunks)" if chunks > 1 else ""
        replicas = _vllm_engines(recipe, pool) if vllm else "one replica per rollout rank"
        return (f"engine: {recipe.rollout.engine}, {replicas} on pool {pool} "
                f"(rollout.placement: separate), behaviour log-probs returned{streamed}")
    if vllm:
        return (f"engine: vllm, colocated on the actor's ranks, {_vllm_engines(recipe, recipe.role('actor').pool)} "
                "(weights synced in memory after each update)")
    return "engine: hf, the actor's own decoding loop"


def _vllm_engines(recipe: Recipe, pool: str) -> str:
    """The pool's vLLM engines and the ranks of each (rollout.vllm.tensor_parallel_size ranks an engine)."""
    section = recipe.resource_pools.get(pool)
    world = sum(int(count) for count in section.process_on_nodes) if section is not None else 1
    return engines_line(world, int(recipe.rollout.vllm.tensor_parallel_size))


def _dynamic_sampling_note(recipe: Recipe, pool: str | None) -> str:
    """When the step generates again: DAPO's filter draws more prompts until the batch holds enough groups with signal."""
    dynamic = recipe.algorithm.filter_groups
    if not dynamic.enable:
        return ""
    queued = "each extra call queues behind the batches in flight, on the group's current weights" if pool is not None else ""
    return _joined(f"repeated with its scoring on more prompts until trainer.batch_size groups differ in {dynamic.metric}, "
                   f"at most {int(dynamic.max_num_gen_batches)} calls a step (algorithm.filter_groups)", queued)


def _partial_note(recipe: Recipe) -> str:
    """What a partial rollout's generate call is: a segment of budgeted tokens, the unfinished samples carried."""
    budget = recipe.rollout.partial_budget
    if budget is None:
        return ""
    return (f"a segment: each unfinished sample, new or carried, continues from its prefix for at most {budget} tokens "
            "(rollout.partial.max_tokens_per_step); the groups whose samples all finished go on to be scored and "
            "trained, the others wait for the next step (their tokens, rollout_log_probs and token_versions kept)")


def _joined(*notes: str) -> str:
    """The non-empty notes of one call, in order."""
    return "; ".join(note for note in notes if note)


def _weight_sync(every: int) -> list[StepCall]:
    """The actor's new weights to the rollout group every ``every`` updates, over a process group of their own (no batch rows)."""
    purpose = "weight sync: actor rank 0 broadcasts to the rollout ranks"
    note = f"every {every} update(s) (rollout.sync_every)" if every > 1 else "after every update"
    return [StepCall("actor", "send_weights", purpose, "weights", note=note),
            StepCall(ROLLOUT_ROLE, "receive_weights", purpose, "weights", note=note)]


def resolve_dims(spec: TensorSpec, rows: int, recipe: Recipe) -> tuple[int, ...]:
    """Concrete shape of ``spec`` for ``rows`` rows under this recipe's lengths."""
    prompt_len = int(recipe.data.max_prompt_length)
    response_len = recipe.rollout.response_width  # max_new_tokens, or the whole trajectory of agent rollouts
    sizes = {"rows": rows, "prompt_len": prompt_len, "response_len": response_len, "seq_len": prompt_len + response_len}
    return tuple(sizes[dim] for dim in spec.dims)
