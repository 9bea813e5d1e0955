"""The samples of partial rollouts between steps: tokens, behaviour log-probs and policy versions, per token.

With ``rollout.partial.max_tokens_per_step: S`` each step's generation gives every unfinished sample at most ``S``
more tokens. A sample that ends (EOS, or ``rollout.max_new_tokens`` reached) is finished; one that does not keeps
what it has and continues in the next step from its prefix (the prompt and its tokens so far), on the weights of
then. Every token remembers the policy version that sampled it and its log-prob under that policy, so the update's
off-policy corrections weigh each token by its own behaviour policy.

A step draws a new batch of prompts only while fewer than two batches of groups are in the making: when long
responses pile up, steps continue them alone rather than widen every segment with new prompts.

GRPO compares a prompt's samples with each other, so samples live in groups (one prompt, ``rollout.n`` samples) and
a step trains the groups whose samples have all finished, at most ``trainer.batch_size`` of them (the oldest drawn
first; the update keeps the synchronous step's shape), and the others wait. A group's age is the age of its oldest token: a group that
would train more than ``trainer.max_staleness`` versions after that token was sampled is dropped, and counted.

This module is pure data: no worker calls. :class:`PartialBuffer` is JSON-serializable (``state_dict``), so a
checkpoint carries the unfinished samples and a resumed run continues them, neither dropping nor repeating one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from rlhfctl.data.pairs import left_padded
from rlhfctl.protocol import DataProto, plain_value
from rlhfctl.rollout.generation import SamplingParams, rollout_batch

__all__ = ["POOL_BATCHES", "PartialBuffer", "PartialGroup", "PartialSample", "training_batch"]

POOL_BATCHES = 2
"""The most batches of groups in the making before a step stops drawing new prompts (see ``wants_prompts``)."""

ENDED = "ended"
"""The column a generation call adds under ``meta_info["partial"]``: whether each row's last token is an EOS."""


@dataclass
class PartialSample:
    """One response in the making: its tokens so far, each token's behaviour log-prob and policy version."""

    tokens: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    segments: int = 0
    finished: bool = False


@dataclass
class PartialGroup:
    """One prompt's ``n`` samples, trained together once all have finished."""

    uid: str
    prompt_ids: list[int]
    columns: dict[str, Any]  # the prompt row's other columns (the reward's ground truth, data source, ...)
    samples: list[PartialSample]

    @property
    def complete(self) -> bool:
        """Every sample has finished."""
        return all(sample.finished for sample in self.samples)

    def oldest_version(self) -> int | None:
        """The policy version of the group's oldest token (None: nothing generated yet)."""
        firsts = [sample.versions[0] for sample in self.samples if sample.versions]
        return min(firsts) if firsts else None


class PartialBuffer:
    """The groups in the making, in the order their prompts were drawn; one generation segment at a time."""

    def __init__(self, n: int, max_new_tokens: int, budget: int, max_staleness: int) -> None:
        self.n, self.max_new_tokens, self.budget, self.max_staleness = int(n), int(max_new_tokens), int(budget), int(max_staleness)
        self.groups: list[PartialGroup] = []
        self.next_group = 0  # numbers the groups' uids, so a resumed run's new groups never share a carried one's
        self._pending: list[tuple[PartialGroup, PartialSample]] = []

    # ------------------------------------------------------------------ the step's calls, in order
    def add(self, prompts: DataProto) -> None:
        """New groups, ``n`` empty samples each, from a batch of left-padded prompts (``to_dataproto``'s)."""
        ids, mask = prompts.batch["input_ids"], prompts.batch["attention_mask"]
        others = {key: values for key, values in prompts.non_tensor_batch.items() if key != "uid"}
        for row in range(len(prompts)):
            columns = {key: plain_value(values[row]) for key, values in others.items()}
            self.groups.append(PartialGroup(f"g{self.next_group}", ids[row][mask[row].bool()].tolist(), columns,
                                            [PartialSample() for _ in range(self.n)]))
            self.next_group += 1

    def drop_stale(self, version: int) -> int:
        """Drop the groups that could not train at ``version`` within ``max_staleness``; returns the samples dropped."""
        floor = version - self.max_staleness
        stale = [group for group in self.groups if (oldest := group.oldest_version()) is not None and oldest < floor]
        self.groups = _without(self.groups, stale)
        return sum(len(group.samples) for group in stale)

    def segment(self) -> DataProto:
        """The next generation call: every unfinished sample's prompt and tokens so far, left-padded, one sample per row,
        at most ``budget`` new tokens (fewer when every row has less room left)."""
        self._pending = [(group, sample) for group in self.groups for sample in group.samples if not sample.finished]
        if not self._pending:
            raise RuntimeError("partial rollouts: a segment with no unfinished sample")
        rows = [group.prompt_ids + sample.tokens for group, sample in self._pending]
        room = max(self.max_new_tokens - len(sample.tokens) for _, sample in self._pending)
        input_ids, attention_mask = left_padded(rows, 0)
        return DataProto.from_dict({"input_ids": input_ids, "attention_mask": attention_mask},
                                   meta_info={"n": 1, "max_new_tokens": min(self.budget, room), "partial": True})

    def take(self, generated: DataProto, version: int) -> None:
        """The last segment's output, row for row: each sample's new tokens (cut at ``max_new_tokens``), their engine
        log-probs and versions (the rows' ``policy_version``, else ``version``); a row that ended or filled its room
        finishes its sample."""
        if len(generated) != len(self._pending):
            raise RuntimeError(f"partial rollouts: {len(generated)} rows came back for {len(self._pending)} sent")
        tensors = generated.batch
        lengths = tensors["response_mask"].sum(-1).tolist()
        ended = tensors[ENDED].tolist()
        versions = tensors["policy_version"].tolist() if "policy_version" in tensors else [version] * len(generated)
        for row, (group, sample) in enumerate(self._pending):
            keep = min(int(lengths[row]), self.max_new_tokens - len(sample.tokens))
            sample.tokens += tensors["responses"][row, :keep].tolist()
            sample.log_probs += tensors["rollout_log_probs"][row, :keep].tolist()
            sample.versions += [int(versions[row])] * keep
            sample.segments += 1
            sample.finished = bool(ended[row]) or len(sample.tokens) >= self.max_new_tokens
        self._pending = []

    def wants_prompts(self, groups_per_step: int) -> bool:
        """Whether a step should draw new prompts: fewer than :data:`POOL_BATCHES` batches of groups are in the making.
        Past that, the step continues the carried samples alone, so long responses cannot grow the segment (and the
        staleness of what waits) without bound."""
        return len(self.groups) < POOL_BATCHES * groups_per_step

    def finished_groups(self) -> int:
        """Groups whose samples have all finished."""
        return sum(group.complete for group in self.groups)

    def unfinished(self) -> int:
        """Samples still generating."""
        return sum(not sample.finished for group in self.groups for sample in group.samples)

    def complete(self, limit: int | None = None) -> list[PartialGroup]:
        """Take out the groups whose samples have all finished (at most ``limit``), the oldest drawn first."""
        done = [group for group in self.groups if group.complete][:limit]
        self.groups = _without(self.groups, done)
        return done

    def carried(self) -> int:
        """Samples waiting for the next step (unfinished ones, and finished ones of unfinished groups)."""
        return sum(len(group.samples) for group in self.groups)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The groups and the uid counter, as JSON: a copy, which later segments do not change (a snapshot taken
        before a segment is sent is what a resume or a restart rewinds to)."""
        return {"next_group": self.next_group, "groups": [
            {"uid": group.uid, "prompt_ids": list(group.prompt_ids), "columns": dict(group.columns),
             "samples": [_own_lists(sample.__dict__) for sample in group.samples]} for group in self.groups]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The groups a checkpoint carried."""
        self.next_group = int(state["next_group"])
        self.groups = [PartialGroup(str(group["uid"]), [int(t) for t in group["prompt_ids"]], dict(group["columns"]),
                                    [PartialSample(**_own_lists(sample)) for sample in group["samples"]])
                       for group in state["groups"]]
        self._pending = []


def training_batch(groups: list[PartialGroup], tokenizer: Any, max_new_tokens: int, temperature: float,
                   pad_id: int) -> DataProto:
    """The finished groups as one rollout batch in every engine's layout (:func:`rollout_batch`), with each token's
    ``rollout_log_probs`` and ``token_versions``, each sample's ``policy_version`` (its oldest token's) and
    ``partial_segments`` (the steps it was generated in)."""
    samples = [(group, sample) for group in groups for sample in group.samples]
    prompt_ids, prompt_mask = left_padded([group.prompt_ids for group, _ in samples], pad_id)
    width = max_new_tokens
    responses = torch.full((len(samples), width), pad_id, dtype=prompt_ids.dtype)
    response_mask = torch.zeros((len(samples), width), dtype=prompt_mask.dtype)
    log_probs = torch.zeros((len(samples), width), dtype=torch.float32)
    versions = torch.zeros((len(samples), width), dtype=torch.int64)
    for row, (_, sample) in enumerate(samples):
        length = len(sample.tokens)
        responses[row, :length] = torch.tensor(sample.tokens, dtype=responses.dtype)
        response_mask[row, :length] = 1
        log_probs[row, :length] = torch.tensor(sample.log_probs, dtype=torch.float32)
        versions[row, :length] = torch.tensor(sample.versions, dtype=torch.int64)
    columns = {key: _column([group.columns[key] for group, _ in samples]) for key in groups[0].columns}
    columns["uid"] = _column([group.uid for group, _ in samples])
    prompts = DataProto(batch={"input_ids": prompt_ids, "attention_mask": prompt_mask}, non_tensor_batch=columns, meta_info={})
    oldest = torch.tensor([min(sample.versions) for _, sample in samples], dtype=torch.int64)
    segments = torch.tensor([sample.segments for _, sample in samples], dtype=torch.int64)
    params = SamplingParams(n=1, max_new_tokens=width, temperature=temperature)
    return rollout_batch(prompts, responses, response_mask, tokenizer, params, {
        "rollout_log_probs": log_probs, "token_versions": versions, "policy_version": oldest, "partial_segments": segments})


def _without(groups: list[PartialGroup], taken: list[PartialGroup]) -> list[PartialGroup]:
    """``groups`` less ``taken``, by identity (not the dataclass's field-by-field equality over every token)."""
    gone = {id(group) for group in taken}
    return [group for group in groups if id(group) not in gone]


def _own_lists(fields: dict[str, Any]) -> dict[str, Any]:
    """A sample's fields with lists of their own (a snapshot and the live buffer never share a token list)."""
    return {key: list(value) if isinstance(value, list) else value for key, value in fields.items()}


def _column(values: list[Any]) -> np.ndarray:
    """An object column of ``values`` (one per sample), as the prompt collation gives them."""
    column = np.empty(len(values), dtype=object)
    column[:] = values
    return column
