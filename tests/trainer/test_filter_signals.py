"""Dynamic sampling's readable signals: the share of generated groups without signal, and the warning of a step that
trains short of groups, sent through the rollouts' notify callback to the trainer's reporter."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rlhfctl.protocol import DataProto
from rlhfctl.recipe import load_recipe
from rlhfctl.rollout.dynamic_sampling import FilteredRollout, exhausted_warning
from rlhfctl.rollout.separate import StreamedRollout, _Chunk
from rlhfctl.trainer.role_groups import RoleGroups
from tests.trainer.test_dynamic_sampling import Ready, generation, settings

QUICKSTART = Path(__file__).resolve().parents[2] / "recipes" / "quickstart.yaml"
SIGNAL, FLAT = [0, 1], [1, 1]  # a group of two whose scores differ, and one whose scores do not


def batch_of(signal: list[bool], first_uid: int):
    return generation(2, [SIGNAL if has else FLAT for has in signal], first_uid=first_uid)


def filtered(first, more, spec, step=None):
    draws, messages = iter(more), []
    rollout = FilteredRollout(spec, first, lambda: next(draws), lambda prompts, batch: Ready(batch), step=step,
                              notify=messages.append)
    return rollout, rollout.responses(), messages


def test_no_signal_fraction_counts_every_generated_group_before_the_cut_and_dropped_fraction_the_groups_not_trained_on():
    first = batch_of([False] * 3 + [True] * 5, first_uid=0)   # 3 of 8 groups without signal: 5 kept
    second = batch_of([False] * 2 + [True] * 6, first_uid=8)  # 2 of 8 without signal; 3 of its 6 fill the step
    rollout, batch, messages = filtered(first, [second], settings(groups=8, batches=4))
    assert rollout.metrics() == {
        "filter/kept_groups": 8.0,
        "filter/gen_batches": 2.0,
        "filter/no_signal_fraction": 5 / 16,  # (3 + 2) of the 16 generated, the surplus with signal not counted
        "filter/dropped_fraction": 0.5,       # 8 of 16 generated not trained on: 5 without signal, 3 past the batch
    }
    assert len(set(batch.non_tensor_batch["uid"].tolist())) == 8
    assert messages == []  # a full step warns of nothing


def test_a_step_that_fills_in_its_first_batch_reports_that_batch_alone():
    rollout, _, _ = filtered(batch_of([True, False, True], first_uid=0), [], settings(groups=2))
    assert rollout.metrics()["filter/no_signal_fraction"] == pytest.approx(1 / 3)
    assert rollout.metrics()["filter/dropped_fraction"] == pytest.approx(1 / 3)


def test_a_short_step_warns_naming_the_step_the_counts_and_the_policy():
    first = batch_of([True] + [False] * 7, first_uid=0)
    second = batch_of([False] * 7 + [True], first_uid=8)
    rollout, batch, messages = filtered(first, [second], settings(groups=8, batches=2), step=3)
    assert messages == ["step 3: algorithm.filter_groups kept 2 of 8 groups after 2 generation batches "
                        "(max_num_gen_batches); training on the groups kept (on_exhausted: train)"]
    assert batch.non_tensor_batch["uid"].tolist() == ["u0", "u0", "u15", "u15"]
    assert rollout.metrics()["filter/no_signal_fraction"] == 14 / 16


def test_a_step_without_any_signal_says_it_trains_on_zero_advantages():
    first, last = batch_of([False, False], first_uid=0), batch_of([False, False], first_uid=2)
    _, batch, messages = filtered(first, [last], settings(groups=2, batches=2), step=7)
    assert batch.non_tensor_batch["uid"].tolist() == ["u2", "u2", "u3", "u3"]  # the last batch as it is
    assert messages == [
        "step 7: algorithm.filter_groups kept 0 of 2 groups after 2 generation batches (max_num_gen_batches): no group "
        "had signal (responses differing in 'score'); this step trains on the last batch as it is: its advantages "
        "are zero, only penalties such as the overlong penalty move the policy (on_exhausted: train)"]


def test_the_warning_without_a_step_and_after_one_batch():
    assert exhausted_warning(None, 1, 4, 1, "acc") == (
        "algorithm.filter_groups kept 1 of 4 groups after 1 generation batch (max_num_gen_batches); training on the "
        "groups kept (on_exhausted: train)")


def test_a_step_that_stops_sends_no_warning_but_the_error():
    from rlhfctl.rollout.dynamic_sampling import FilterGroupsExhausted

    messages = []
    rollout = FilteredRollout(settings(groups=2, batches=1, on_exhausted="error"), batch_of([False], 0), lambda: None,
                              lambda prompts, batch: Ready(batch), step=1, notify=messages.append)
    with pytest.raises(FilterGroupsExhausted):
        rollout.responses()
    assert messages == []


# ---------------------------------------------------------------------------------- the wiring to the reporter
class _Method:
    def __init__(self, fn):
        self.fn = fn

    def submit(self, data):
        return Ready(self.fn(data if isinstance(data, DataProto) else data.get()))


class _FakeGroup:
    """A worker group of one rank in the driver: generates n identical responses per prompt, or scores them 1."""

    backend, world_size = "ray", 1

    def __init__(self, n: int = 0) -> None:
        self.observers: list = []
        self.n = n
        self.generate_sequences = _Method(self._generate)
        self.compute_rewards = _Method(self._reward)

    def _generate(self, prompts: DataProto) -> DataProto:
        ids = prompts.batch["input_ids"].repeat_interleave(self.n, 0)
        responses = torch.full((len(ids), 2), 5)
        mask = torch.cat([prompts.batch["attention_mask"].repeat_interleave(self.n, 0), torch.ones_like(responses)], 1)
        return DataProto.from_dict(
            tensors={"prompts": ids, "responses": responses, "input_ids": torch.cat([ids, responses], 1),
                     "attention_mask": mask, "position_ids": mask.cumsum(-1) - 1, "response_mask": torch.ones_like(responses)},
            non_tensors={"uid": np.repeat(prompts.non_tensor_batch["uid"], self.n)})

    def _reward(self, generated: DataProto) -> DataProto:
        scores = torch.zeros(len(generated), 2)
        scores[:, -1] = 1.0  # every response alike: no group has signal
        return DataProto.from_dict(tensors={"token_level_scores": scores},
                                   non_tensors={"score": np.ones(len(generated))})


class _Reporter:
    def __init__(self) -> None:
        self.messages: list[tuple[str, str]] = []

    def message(self, text: str, level: str = "info") -> None:
        self.messages.append((text, level))


def test_the_trainer_hands_the_colocated_rollouts_a_callback_that_reaches_the_reporter(tmp_path):
    from rlhfctl.trainer.ppo_trainer import PPOTrainer

    cfg = load_recipe(QUICKSTART, [
        f"trainer.output_dir={tmp_path}", "trainer.batch_size=2", "trainer.mini_batch_size=2", "trainer.total_steps=5",
        "rollout.n=2", "algorithm.filter_groups.enable=true", "algorithm.filter_groups.max_num_gen_batches=2",
        "algorithm.filter_groups.metric=score", "data.num_train=16"])
    reporter = _Reporter()
    trainer = PPOTrainer(cfg, reporter, groups=RoleGroups({"actor": _FakeGroup(n=2), "reward": _FakeGroup()}))
    rollouts = trainer.rollouts
    rollouts.start(2)  # a run resumed after step 2: the next rollout is step 3's
    batch = rollouts.next().responses()
    assert len(batch) == 4 and rollouts.draws == 2  # the step drew its two batches, then trained on the last
    text, level = reporter.messages[-1]
    assert level == "warning" and text.startswith("step 3: algorithm.filter_groups kept 0 of 2 groups after 2 ")
    rollouts.send_ahead(3)  # trainer.overlap_rollout: step 4's rollout is sent during step 3
    rollouts.next().responses()
    assert reporter.messages[-1][0].startswith("step 4: ")


def test_a_separate_rollout_group_names_its_batch_step_in_the_warning():
    messages = []
    rollouts = SimpleNamespace(group_filter=settings(groups=2, batches=1), critic=None, reference=None, scorers=(),
                               _notify=messages.append, staleness_metrics=lambda step, batch: {},
                               extra_generation=lambda step: None, sync_metrics=lambda step: {})
    first = batch_of([True, False], first_uid=0)
    streamed = StreamedRollout(6, first.prompts, [_Chunk(first.generated, first.reward)], rollouts, ({}, 0))
    batch = streamed.responses()
    assert batch.non_tensor_batch["uid"].tolist() == ["u0", "u0"]
    assert messages == ["step 6: algorithm.filter_groups kept 1 of 2 groups after 1 generation batch "
                        "(max_num_gen_batches); training on the groups kept (on_exhausted: train)"]
    assert streamed.metrics()["filter/no_signal_fraction"] == 0.5
