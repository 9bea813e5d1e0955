"""DAPO dynamic sampling (``algorithm.filter_groups``): fill a step with groups whose responses differ.

A step's first generation batch is drawn and sent like any rollout. Once it is generated and scored,
the groups whose samples all have the same metric are dropped (:func:`groups_with_signal`); while fewer
than ``trainer.batch_size`` groups are kept, another batch of prompts is drawn from the same prompt
stream and generated, up to ``max_num_gen_batches`` batches. The kept groups, in the order they were
generated, are cut to ``trainer.batch_size``; only they go on to the values and the reference
log-probs. Every draw goes through the one batcher, so the prompt order is the run's seed's, and a
checkpoint's batcher state covers the extra draws: a resumed run is step-exact.

When the batches run out first, ``on_exhausted: train`` trains on the groups kept (``filter/kept_groups``
says how many; with none kept, on the last batch as it is) and sends a warning naming the step, and
``on_exhausted: error`` stops the run.

Metrics (:meth:`FilteredRollout.metrics`), counted over every batch the step generated:

- ``filter/kept_groups``: the groups trained on (at most ``trainer.batch_size``);
- ``filter/gen_batches``: the generation batches the step drew;
- ``filter/no_signal_fraction``: the share of the generated groups whose samples all had the same metric
  (no learning signal), counted before the kept groups are cut to the batch: how hard or easy the prompts
  are for the policy;
- ``filter/dropped_fraction``: the share of the generated groups not trained on, ``1 - kept / generated``:
  the groups without signal, and the groups with signal generated past ``trainer.batch_size`` (a step that
  fills up in its second batch drops at least that batch's surplus, so this is no measure of the signal).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from rlhfctl.algorithms.group_filter import groups_with_signal, kept_uids_in_order
from rlhfctl.errors import UserError
from rlhfctl.protocol import DataProto
from rlhfctl.rollout.batch_join import concat_prompt_padded
from rlhfctl.recipe.specs import Recipe
from rlhfctl.trainer.sample_metric import sample_metric

__all__ = ["FilterGroupsExhausted", "FilteredRollout", "Generation", "GroupFilterSettings", "exhausted_warning"]


class FilterGroupsExhausted(UserError, RuntimeError):
    """``algorithm.filter_groups.on_exhausted: error``: the step's generation batches left it short of groups."""


@dataclass(frozen=True)
class GroupFilterSettings:
    """What the filter reads from the recipe, once."""

    metric: str
    max_num_gen_batches: int
    on_exhausted: str
    groups_per_step: int
    pad_token_id: int

    @classmethod
    def from_recipe(cls, recipe: Recipe, pad_token_id: int) -> GroupFilterSettings | None:
        """The settings, or None when ``algorithm.filter_groups.enable`` is off."""
        spec = recipe.algorithm.filter_groups
        if not spec.enable:
            return None
        return cls(str(spec.metric), int(spec.max_num_gen_batches), str(spec.on_exhausted), int(recipe.trainer.batch_size),
                   int(pad_token_id))


@dataclass(frozen=True)
class Generation:
    """One generation batch in flight: its prompts, the generation future and the reward future behind it."""

    prompts: DataProto
    generated: Any
    reward: Any

    def scored(self) -> DataProto:
        """The generated batch with the reward joined (waits for both)."""
        return self.generated.get().union(self.reward.get())


class FilteredRollout:
    """A step's rollout under dynamic sampling; read like :class:`rlhfctl.rollout.colocated.Rollout`.

    ``responses()`` generates and filters until the step is full, then sends the values and the
    reference log-probs for the kept samples (``send_scoring``); ``scored()`` joins them as a plain
    rollout does. ``prompts`` are the kept groups' prompts once ``responses()`` returned. A step that trains
    short of ``trainer.batch_size`` groups (``on_exhausted: train``) sends ``notify`` a warning naming ``step``.
    """

    def __init__(self, settings: GroupFilterSettings, first: Generation, draw: Callable[[], Generation],
                 send_scoring: Callable[[DataProto, DataProto], Any], step: int | None = None,
                 notify: Callable[[str], None] | None = None) -> None:
        self.settings, self.first, self.draw, self.send_scoring = settings, first, draw, send_scoring
        self.step, self.notify = step, notify
        self.prompts: DataProto = first.prompts
        self._metrics: dict[str, float] = {}
        self._rollout: Any = None

    def responses(self) -> DataProto:
        """The step's kept samples, scored by the reward (generates more batches as needed)."""
        batch, self.prompts, self._metrics = self._fill()
        self._rollout = self.send_scoring(self.prompts, batch)
        return batch

    def scored(self, batch: DataProto, reference_on_driver: bool) -> tuple[DataProto, list[Any]]:
        """``batch`` with the values (and the reference, see ``Rollout.scored``) of the kept samples joined."""
        return self._rollout.scored(batch, reference_on_driver)

    def metrics(self) -> dict[str, float]:
        """``filter/kept_groups``, ``filter/gen_batches``, ``filter/no_signal_fraction`` and ``filter/dropped_fraction``
        of this step (see the module docstring)."""
        return dict(self._metrics)

    def _fill(self) -> tuple[DataProto, DataProto, dict[str, float]]:
        wanted, settings = self.settings.groups_per_step, self.settings
        batches, prompts, kept, generated_groups, no_signal, last = [], [], 0, 0, 0, None
        generation = self.first
        for number in range(1, settings.max_num_gen_batches + 1):
            last = (generation.scored(), generation.prompts)
            batch, batch_prompts = last
            uids = batch.non_tensor_batch["uid"]
            keep = groups_with_signal(sample_metric(batch, settings.metric), uids)
            with_signal = kept_uids_in_order(uids, keep)
            kept_uids = with_signal[: wanted - kept]
            groups = len(set(uids.tolist()))
            generated_groups += groups
            no_signal += groups - len(with_signal)
            batches.append(_rows_of(batch, kept_uids))
            prompts.append(_rows_of(batch_prompts, kept_uids))
            kept += len(kept_uids)
            if kept >= wanted or number == settings.max_num_gen_batches:
                break
            generation = self.draw()
        metrics = {
            "filter/kept_groups": float(kept),
            "filter/gen_batches": float(number),
            "filter/no_signal_fraction": no_signal / max(generated_groups, 1),
            "filter/dropped_fraction": 1.0 - kept / max(generated_groups, 1),
        }
        if kept < wanted:
            self._short(kept, number)
            if self.notify is not None:
                self.notify(exhausted_warning(self.step, kept, wanted, number, settings.metric))
            if kept == 0:
                return last[0], last[1], metrics  # nothing has signal: the last batch as it is
        return concat_prompt_padded(batches, self.settings.pad_token_id), concat_prompt_padded(prompts, self.settings.pad_token_id), metrics

    def _short(self, kept: int, batches: int) -> None:
        if self.settings.on_exhausted == "error":
            raise FilterGroupsExhausted(
                f"algorithm.filter_groups: after {batches} generation batches (max_num_gen_batches) only {kept} of "
                f"{self.settings.groups_per_step} groups had responses differing in {self.settings.metric!r}; the "
                "prompts may be too easy or too hard for the policy. Raise max_num_gen_batches, or set "
                "algorithm.filter_groups.on_exhausted=train to train on the groups kept"
            )


def exhausted_warning(step: int | None, kept: int, wanted: int, batches: int, metric: str) -> str:
    """The warning of a step that trains short of ``wanted`` groups (``on_exhausted: train``): ``kept`` after ``batches``."""
    head = (f"{'' if step is None else f'step {step}: '}algorithm.filter_groups kept {kept} of {wanted} groups after "
            f"{batches} generation batch{'es' if batches != 1 else ''} (max_num_gen_batches)")
    if kept:
        return f"{head}; training on the groups kept (on_exhausted: train)"
    return (f"{head}: no group had signal (responses differing in {metric!r}); this step trains on the last batch as "
            "it is: its advantages are zero, only penalties such as the overlong penalty move the policy "
            "(on_exhausted: train)")


def _rows_of(data: DataProto, uids: list[Any]) -> DataProto:
    """The rows of ``data`` whose ``uid`` is one of ``uids``, in ``data``'s order."""
    wanted = set(uids)
    rows = np.array([uid in wanted for uid in data.non_tensor_batch["uid"].tolist()], dtype=bool)
    return data[np.flatnonzero(rows)]
