"""A step's rollout: the prompts sent to the actor, with reward, values and reference log-probs queued behind generation.

All the futures of the PPO step's first half live here, so ``PPOTrainer.train_step`` reads as its
phases. :class:`Rollouts` draws each step's prompts and sends them; with ``trainer.overlap_rollout`` it
sends the next step's before this step ends. A :class:`Rollout` is one step's calls in flight.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable


import torch

from rlhfctl.protocol import DataProto
from rlhfctl.recipe.specs import Recipe
from rlhfctl.run_signals import stop_requested
from rlhfctl.single_controller import WorkerGroup
from rlhfctl.single_controller.futures import GroupFuture, PendingUnion
from rlhfctl.single_controller.worker_group import GroupMethod
from rlhfctl.rollout.dynamic_sampling import FilteredRollout, Generation, GroupFilterSettings
from rlhfctl.rollout.partial import PartialRollout, PartialSettings, partial_buffer
from rlhfctl.rollout.staleness import updates_before
from rlhfctl.trainer.prompt_source import to_dataproto

__all__ = ["CallWhenNeeded", "Done", "NoReward", "Rollout", "Rollouts", "TokenScorer", "join", "reward_call", "score_on_driver", "send_scoring"]

TokenScorer = tuple[WorkerGroup, str]
"""A frozen role's group and the method whose per-token column the advantages read (``TOKEN_SCORING_ROLES``)."""


def join(batch: DataProto, futures: list[Any]) -> DataProto:
    """The batch with the futures' results joined in, on the driver."""
    return PendingUnion(batch, tuple(futures)).get() if futures else batch


@dataclass
class Rollout:
    """One step's calls in flight: generation, then reward, values (with a critic), the token-scoring roles' columns (a
    teacher's log-probs) and reference log-probs (with a reference)."""

    prompts: DataProto
    generated: GroupFuture
    reward: Any
    values: Any | None
    reference: Any | None
    token_scores: tuple[Any, ...] = ()

    def responses(self) -> DataProto:
        """The generated batch: prompts, responses and their masks (waits for the actor)."""
        return self.generated.get()

    def scored(self, batch: DataProto, reference_on_driver: bool) -> tuple[DataProto, list[Any]]:
        """``batch`` with the reward and the values joined, and the reference log-probs when ``reference_on_driver``.

        Otherwise the reference future is returned pending: it joins the batch on the actor's ranks
        during ``update_actor`` (see ``union_pending``), so the update is sent while the reference pass
        still runs. The KL penalty in the reward and batch balancing read it on the driver first.
        """
        batch = join(batch, [future for future in (self.reward, self.values, *self.token_scores) if future is not None])
        if self.reference is None:
            return batch, []
        if reference_on_driver:
            return join(batch, [self.reference]), []
        return batch, [self.reference]

    def metrics(self) -> dict[str, float]:
        """What the rollout itself reports (dynamic sampling's filter counts; none here)."""
        return {}


class Done:
    """A batch already on the driver, behind a future's ``get()``."""

    def __init__(self, value: DataProto) -> None:
        self.value = value

    def get(self) -> DataProto:
        return self.value


def send_scoring(critic: WorkerGroup | None, reference: WorkerGroup | None, scorers: Sequence[TokenScorer],
                 prompts: DataProto, batch: DataProto, reward: Any = None) -> Rollout:
    """The values, token scores and reference log-probs of samples already generated (and rewarded, or ``reward``
    pending), on the driver (the kept groups of dynamic sampling, a batch collected from a rollout group of its own)."""
    values = None if critic is None else critic.compute_values.submit(batch)
    token_scores = tuple(getattr(group, method).submit(batch) for group, method in scorers)
    reference_log_probs = None if reference is None else reference.compute_ref_log_prob.submit(batch)
    return Rollout(prompts, Done(batch), reward, values, reference_log_probs, token_scores)


def score_on_driver(reward: WorkerGroup | None, critic: WorkerGroup | None, reference: WorkerGroup | None,
                    scorers: Sequence[TokenScorer], prompts: DataProto, batch: DataProto) -> Rollout:
    """The reward and every scoring call of a batch assembled on the driver (a partial rollout's finished groups)."""
    rewarded = reward_call(reward, Done(batch), lambda done: reward.compute_rewards.submit(done.get()))
    return send_scoring(critic, reference, scorers, prompts, batch, rewarded)


class NoReward:
    """The reward of a run without a reward role (distillation alone, ``algorithm.distillation.mix: 0``): a zero
    ``token_level_scores`` for every sample of the generated batch, so the step's advantages are the teacher's alone."""

    def __init__(self, generated: Any) -> None:
        self.generated = generated

    def get(self) -> DataProto:
        responses = self.generated.get().batch["responses"]
        return DataProto.from_dict({"token_level_scores": responses.new_zeros(responses.shape, dtype=torch.float32)})


def reward_call(reward: WorkerGroup | None, generated: Any, send: Callable[[Any], Any]) -> Any:
    """``send(generated)`` (the reward role's call, however the caller sends it), or :class:`NoReward` without one."""
    return NoReward(generated) if reward is None else send(generated)


class CallWhenNeeded:
    """A scoring call on a group in the driver process, made at the first ``get()`` with the collected rollout."""

    def __init__(self, method: GroupMethod, generated: GroupFuture) -> None:
        self.method, self.generated = method, generated
        self._result: Any = None
        self._done = False

    def get(self) -> Any:
        if not self._done:
            self._result = self.method.submit(self.generated.get()).get()
            self._done = True
        return self._result


class Rollouts:
    """Draws each step's prompts, sends them to the actor and queues the scoring calls behind generation.

    Reward, values and reference log-probs are independent calls, in flight together. They are sent
    before the rollout is back: a group with the actor's world size is fed the rollout future itself,
    so each rank starts from its own shard as soon as generation ends, without a round trip through
    the driver; other groups get the rollout fetched by the driver. The reference goes last: colocated
    roles run in submission order, and the advantages need only the reward, the values and the token scores
    (``scorers``: a teacher's log-probs). A reward in
    the driver (``pool: driver``) is scored when the driver first needs it: a call there runs when it is
    made, and would wait for the rollout. ``notify`` gets the warnings of a step's rollout (dynamic sampling that
    ran out of batches).
    """

    def __init__(self, recipe: Recipe, batcher: Any, tokenizer: Any, actor: WorkerGroup, reward: WorkerGroup,
                 critic: WorkerGroup | None, reference: WorkerGroup | None,
                 notify: Callable[[str], None] | None = None, scorers: Sequence[TokenScorer] = ()) -> None:
        self.trainer_cfg = recipe.trainer
        self._notify = notify
        self._step = 0  # the last step a rollout was taken for (start() sets where a resumed run begins)
        self.batcher, self.tokenizer = batcher, tokenizer
        self.actor, self.reward, self.critic, self.reference = actor, reward, critic, reference
        self.scorers = tuple(scorers)
        self.group_filter = GroupFilterSettings.from_recipe(recipe, tokenizer.pad_token_id)
        self._ahead: Rollout | FilteredRollout | None = None
        # Each draw of prompts is numbered, and the number seeds its generation (rlhfctl.engine.seeding.generation_seed_parts):
        # a resumed run draws the same samples whatever the actor's ranks ran after the checkpoint. None: a checkpoint
        # from before the numbering, whose generations follow the actor's own call counter.
        self.draws: int | None = 0
        self._before_ahead: tuple[dict[str, Any], int | None] = ({}, 0)
        # rollout.partial: the unfinished samples between steps, and what the version of a step's weights is
        self.partial = partial_buffer(recipe)
        self._partial_settings = PartialSettings(recipe, tokenizer) if self.partial is not None else None
        self._critic_warmup = int(recipe.trainer.critic_warmup_steps)

    @property
    def generator(self) -> WorkerGroup:
        """Who samples responses: the actor's ranks."""
        return self.actor

    def start(self, completed_step: int) -> None:
        """Nothing to open before the first step: the actor generates on its own weights (the steps count from here)."""
        self._step = completed_step

    def before_validation(self, step: int) -> None:
        """Nothing to send: the actor validates on the weights it trains."""

    def next(self) -> Rollout | FilteredRollout | PartialRollout:
        """This step's rollout: the one sent ahead during the last step, or one sent now."""
        self._step += 1
        rollout, self._ahead = self._ahead or self._send(self._step), None
        return rollout

    def send_ahead(self, step: int) -> None:
        """Send the next step's rollout now, when ``step`` allows it (see :meth:`may_send_ahead`)."""
        if self.may_send_ahead(step):
            self._ahead = self._send(step + 1)  # queued behind the update on the actor's ranks

    def may_send_ahead(self, step: int) -> bool:
        """Whether to send the next step's rollout before this step ends (``trainer.overlap_rollout``).

        A rank runs the calls it is sent in order, so generation starts on the weights this step's
        update leaves, exactly as if it were sent after the update returned; the driver's end-of-step
        work then overlaps generation. Not after steps that save or validate (those calls must come
        first), nor at the last step, nor on the local backend (its calls run as they are sent).
        """
        trainer = self.trainer_cfg
        if self.partial is not None:
            return False  # the next step's segment continues this step's unfinished samples: known once it is back
        if not trainer.overlap_rollout or self.actor.backend != "ray" or step >= trainer.total_steps or stop_requested():
            return False  # a stop saves this step: nothing of the next goes out
        return not (trainer.save_every and step % trainer.save_every == 0) and not (trainer.val_every and step % trainer.val_every == 0)

    def batcher_state(self) -> dict[str, Any]:
        """The prompt order as of the last completed step, even when the next step's prompts are drawn."""
        return self._before_ahead[0] if self._ahead is not None else self.batcher.state_dict()

    def driver_state(self) -> dict[str, Any]:
        """The number of draws as of the last completed step (the next draw's number seeds its generation)."""
        draws = self._before_ahead[1] if self._ahead is not None else self.draws
        partial = {} if self.partial is None else {"partial_rollouts": self.partial.state_dict()}
        return ({} if draws is None else {"rollout_draws": draws}) | partial

    def restore_driver_state(self, state: dict[str, Any]) -> None:
        self.draws = int(state["rollout_draws"]) if "rollout_draws" in state else None
        if self.partial is not None and "partial_rollouts" in state:
            self.partial.load_state_dict(state["partial_rollouts"])

    def _send(self, step: int) -> Rollout | FilteredRollout | PartialRollout:
        """Step ``step``'s first draw: generation with every scoring call queued behind it, or, with
        ``algorithm.filter_groups``, generation and reward only (the rest waits for the kept groups)."""
        self._before_ahead = (self.batcher.state_dict(), self.draws)
        if self.partial is not None:
            return self._send_partial(step)
        if self.group_filter is not None:
            return FilteredRollout(self.group_filter, self._generation(), self._generation, self._send_scoring,
                                   step=step, notify=self._notify)
        generation = self._generation()
        values = None if self.critic is None else self._score(self.critic, self.critic.compute_values, generation.generated)
        token_scores = tuple(self._score(group, getattr(group, method), generation.generated) for group, method in self.scorers)
        reference = (None if self.reference is None
                     else self._score(self.reference, self.reference.compute_ref_log_prob, generation.generated))
        return Rollout(generation.prompts, generation.generated, generation.reward, values, reference, token_scores)

    def _generation(self) -> Generation:
        """The next batch of prompts sent to the actor, with the reward queued behind generation."""
        prompts = to_dataproto(next(self.batcher), self.tokenizer)
        if self.draws is not None:
            prompts.meta_info["draw"] = self.draws
            self.draws += 1
        generated = self.actor.generate_sequences.submit(prompts)
        reward = reward_call(self.reward, generated, lambda batch: self._score(self.reward, self.reward.compute_rewards, batch))
        return Generation(prompts, generated, reward)

    def _send_scoring(self, prompts: DataProto, batch: DataProto) -> Rollout:
        return send_scoring(self.critic, self.reference, self.scorers, prompts, batch)

    def _send_partial(self, step: int) -> PartialRollout:
        """Step ``step``'s partial rollout: its prompts added as new groups (unless enough are in the making), the groups
        too old for this step's weights dropped; its segments are sent when the step reads its responses."""
        if self.partial.wants_prompts(self._partial_settings.groups_per_step):
            self.partial.add(to_dataproto(next(self.batcher), self.tokenizer))
        version = updates_before(step, self._critic_warmup)
        dropped = self.partial.drop_stale(version)
        return PartialRollout(step, self.partial, self._partial_settings, version, dropped, self._send_segment,
                              self._score_finished)

    def _send_segment(self, segment: DataProto) -> GroupFuture:
        """A partial rollout's segment on the actor's ranks, numbered like a draw (its random stream)."""
        if self.draws is not None:
            segment.meta_info["draw"] = self.draws
            self.draws += 1
        return self.actor.generate_sequences.submit(segment)

    def _score_finished(self, prompts: DataProto, batch: DataProto) -> Rollout:
        return score_on_driver(self.reward, self.critic, self.reference, self.scorers, prompts, batch)

    def _score(self, group: WorkerGroup, method: GroupMethod, generated: GroupFuture) -> Any:
        """Send ``method`` the rollout: its future where the group's ranks can take their shards from the actor's."""
        if group.backend == "local" and self.actor.backend != "local":  # a group of the driver process (pool: driver)
            return CallWhenNeeded(method, generated)
        if group.world_size == self.actor.world_size:
            return method.submit(generated)
        return method.submit(generated.get())
