"""One step's partial rollout (``rollout.partial.max_tokens_per_step``): a budgeted segment, then the finished groups.

A step draws its prompts as any step does and adds them to the :class:`~rlhfctl.rollout.partial_buffer.PartialBuffer`
as new groups, drops the carried groups that would train too old (``trainer.max_staleness``), and sends one
generation call, the *segment*, with every unfinished sample continued from its prefix for at most the budget's
tokens. The groups whose samples have all finished, at most ``trainer.batch_size`` of them and the oldest drawn
first, are this step's batch, so the update keeps the synchronous step's mini-batches (a step may train fewer); the
others wait for the next step, which continues the unfinished ones on the weights its update left. Long responses are what waits, not the step. Should no group have finished, the step sends another
segment on the same weights, so every step trains something. The finished groups go on to the reward, values, token scores and
reference like any rollout (:func:`~rlhfctl.rollout.colocated.send_scoring`).

Colocated, the actor's ranks generate the segment when the step starts. On a pool of its own, the rollout group
generates step ``t + 1``'s segment while the actor trains step ``t``: it is sent as soon as step ``t``'s segment is
back (its unfinished samples are then known), so one segment is in flight at a time.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from rlhfctl.protocol import DataProto
from rlhfctl.recipe.specs import Recipe
from rlhfctl.rollout.partial_buffer import PartialBuffer, training_batch

__all__ = ["PartialRollout", "PartialSettings", "partial_buffer"]


def partial_buffer(recipe: Recipe) -> PartialBuffer | None:
    """The buffer of ``rollout.partial`` (None when it is off)."""
    rollout = recipe.rollout
    if rollout.partial_budget is None:
        return None
    settings = rollout.settings
    return PartialBuffer(int(settings.n), int(settings.max_new_tokens), rollout.partial_budget, rollout.max_staleness)


class PartialSettings:
    """What a step's batch is built with: the tokenizer (texts, pad id) and the rollout's width and temperature."""

    def __init__(self, recipe: Recipe, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.max_new_tokens = int(recipe.rollout.settings.max_new_tokens)
        self.temperature = float(recipe.rollout.settings.temperature)
        self.pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)
        self.groups_per_step = int(recipe.trainer.batch_size)  # the most groups a step trains: the update's usual shape


class PartialRollout:
    """One step's partial rollout; read like :class:`rlhfctl.rollout.colocated.Rollout`.

    ``send_segment`` sends a segment's call and returns its future; ``first`` is a segment sent ahead (a rollout
    group of its own), else the step sends its own. ``version`` is the policy version that trains this step: no
    trained token may be more than ``max_staleness`` versions older. ``scoring(prompts, batch)`` sends the finished
    groups' reward and scoring calls; ``collected()`` runs once the step's segments are back (sends the next step's
    segment ahead); ``extra_metrics()`` adds what the placement reports (weight syncs). ``before`` is what a resume
    rewinds to: the prompt order, the draw count and the buffer before this step's prompts were added.
    """

    def __init__(self, step: int, buffer: PartialBuffer, settings: PartialSettings, version: int, dropped: int,
                 send_segment: Callable[[DataProto], Any], scoring: Callable[[DataProto, DataProto], Any],
                 first: Any = None, collected: Callable[[], None] | None = None,
                 extra_metrics: Callable[[], dict[str, float]] | None = None, before: tuple[Any, ...] = ()) -> None:
        self.step, self.buffer, self.settings, self.version, self.dropped = step, buffer, settings, version, dropped
        self.send_segment, self.scoring, self.first = send_segment, scoring, first
        self.collected = collected or (lambda: None)
        self.extra_metrics = extra_metrics or dict
        self.before = before
        self.prompts: DataProto | None = None
        self.back = False  # every segment of the step is back (the next step's may be sent)
        self._rollout: Any = None
        self._metrics: dict[str, float] = {}

    def responses(self) -> DataProto:
        """The finished groups' samples (every segment this step needed)."""
        buffer = self.buffer
        pending = self.first if self.first is not None else self.send_segment(buffer.segment())
        segments = 0
        while True:
            buffer.take(pending.get(), self.version)
            segments += 1
            if buffer.finished_groups() or not buffer.unfinished():
                break
            pending = self.send_segment(buffer.segment())  # no group finished: more tokens on the same weights
        groups = buffer.complete(self.settings.groups_per_step)
        self.back = True
        self.collected()
        settings = self.settings
        batch = training_batch(groups, settings.tokenizer, settings.max_new_tokens, settings.temperature, settings.pad_id)
        ages = self._token_ages(batch)
        self.prompts = batch[np.arange(0, len(batch), len(groups[0].samples))]  # one row per group
        self._metrics = {
            "rollout/partial/trained_samples": float(len(batch)),
            "rollout/partial/carried": float(self.buffer.carried()),
            "rollout/partial/dropped": float(self.dropped),
            "rollout/partial/segments/mean": float(batch.batch["partial_segments"].double().mean()),
            "rollout/partial/step_segments": float(segments),
            "rollout/partial/staleness/mean": float(ages.double().mean()) if ages.numel() else 0.0,
            "rollout/partial/staleness/max": float(ages.max()) if ages.numel() else 0.0,
        }
        self._rollout = self.scoring(self.prompts, batch)
        return batch

    def _token_ages(self, batch: DataProto) -> torch.Tensor:
        """How many versions before ``version`` each trained token was sampled; a token past the bound is a bug here."""
        mask = batch.batch["response_mask"].bool()
        ages = (self.version - batch.batch["token_versions"])[mask]
        if ages.numel() and int(ages.max()) > self.buffer.max_staleness:
            raise RuntimeError(f"partial rollouts: step {self.step} would train a token {int(ages.max())} versions old "
                               f"(trainer.max_staleness: {self.buffer.max_staleness})")
        return ages

    def scored(self, batch: DataProto, reference_on_driver: bool) -> tuple[DataProto, list[Any]]:
        """``batch`` with the reward and values joined (and the reference, as :class:`Rollout` hands it over)."""
        return self._rollout.scored(batch, reference_on_driver)

    def metrics(self) -> dict[str, float]:
        """``rollout/partial/*`` of this step (trained, carried and dropped samples, segments, token staleness)."""
        return {**self._metrics, **self.extra_metrics()}
