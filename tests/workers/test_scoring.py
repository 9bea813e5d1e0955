"""Scoring layer by layer (rlhfctl/engine/placement.py ``scoring``): the no-gradient passes gather one FSDP2 unit at a
time, give the numbers of the whole-model gather, and run as many forwards on every rank, even when the
ranks hold different numbers of rows (real Ray, world 2, gloo). Plus the FSDP2 mesh's device decision."""

from __future__ import annotations


import pytest
import torch

from rlhfctl.protocol import DataProto
from tests.workers.conftest import ray_role_group
from tests.workers.recipes import TINY_MODEL, tiny_recipe
from tests.workers.scoring_workers import ScoringActor, ScoringCritic, ScoringReward
from rlhfctl.engine.placement import mesh_device_type
from rlhfctl.engine.micro_batches import scoring_slices

PROMPT, RESPONSE, ROWS = 6, 5, 7
UNEVEN = [5, 2]  # rank 0 holds 5 rows (3 micro-batches of 2), rank 1 holds 2 (1 micro-batch)
CALL_TIMEOUT_S = 180  # a rank waiting for a forward the other never runs would hang: fail instead


def uneven_batch() -> DataProto:
    """Seeded rows, the first two left-padded, with full response masks."""
    generator = torch.Generator().manual_seed(3)
    input_ids = torch.randint(5, 60, (ROWS, PROMPT + RESPONSE), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, :2] = 0
    attention_mask[1, :1] = 0
    return DataProto.from_dict({
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
        "responses": input_ids[:, PROMPT:].clone(),
        "response_mask": torch.ones(ROWS, RESPONSE, dtype=torch.long),
    })


def ray_role(worker: type, recipe: dict, role: str, name: str):
    """A two-rank group of ``worker`` (see ``ray_role_group``)."""
    return ray_role_group(worker, recipe, role, name)


@pytest.mark.slow
def test_per_unit_log_probs_equal_the_whole_gather_with_uneven_ranks(ray_session):
    recipe = tiny_recipe(roles={"actor": {"strategy": "fsdp2", "micro_batch_size": 2}})
    batch = uneven_batch()
    with ray_role(ScoringActor, recipe, "actor", "scoring-actor") as group:
        ranks = group.submit("uneven_log_probs", batch, UNEVEN).get(timeout=CALL_TIMEOUT_S)
        dispatched = group.submit("compute_log_prob", batch).get(timeout=CALL_TIMEOUT_S)
    assert [rank["forwards"] for rank in ranks] == [3, 3]  # rank 1 ran its one micro-batch twice more
    assert [rank["per_unit"].shape[0] for rank in ranks] == UNEVEN  # the repeats' results were dropped
    for rank in ranks:
        torch.testing.assert_close(rank["per_unit"], rank["gathered"], atol=1e-6, rtol=0)
        torch.testing.assert_close(rank["per_unit_entropy"], rank["gathered_entropy"], atol=1e-6, rtol=0)
    gathered = torch.cat([rank["gathered"] for rank in ranks])
    torch.testing.assert_close(dispatched.batch["old_log_probs"], gathered, atol=1e-6, rtol=0)


@pytest.mark.slow
def test_per_unit_values_equal_the_whole_gather_with_uneven_ranks(ray_session):
    recipe = tiny_recipe(roles={"critic": {"strategy": "fsdp2", "micro_batch_size": 2}})
    with ray_role(ScoringCritic, recipe, "critic", "scoring-critic") as group:
        ranks = group.submit("uneven_values", uneven_batch(), UNEVEN).get(timeout=CALL_TIMEOUT_S)
    assert [rank["forwards"] for rank in ranks] == [3, 3]
    for rank, rows in zip(ranks, UNEVEN):
        assert rank["per_unit"].shape == (rows, RESPONSE)
        torch.testing.assert_close(rank["per_unit"], rank["gathered"], atol=1e-6, rtol=0)


@pytest.mark.slow
def test_per_unit_reward_model_scores_equal_the_whole_gather_with_uneven_ranks(ray_session):
    recipe = tiny_recipe(roles={"reward": {"function": None, "model": TINY_MODEL, "strategy": "fsdp2", "batch_size": 2}})
    texts = ["12+3=15", "7*8=56", "9", "100-1=99", "2+2=4", "31", "6/3=2"]
    with ray_role(ScoringReward, recipe, "reward", "scoring-reward") as group:
        ranks = group.submit("uneven_scores", texts, UNEVEN).get(timeout=CALL_TIMEOUT_S)
    assert [rank["forwards"] for rank in ranks] == [3, 3]
    for rank, rows in zip(ranks, UNEVEN):
        assert len(rank["per_unit"]) == rows
        torch.testing.assert_close(torch.tensor(rank["per_unit"]), torch.tensor(rank["gathered"]), atol=1e-6, rtol=0)


def test_scoring_slices_keep_every_row_once_and_pad_only_when_balanced():
    cpu = torch.device("cpu")
    assert scoring_slices(5, 2, balance=False, device=cpu) == [(slice(0, 2), True), (slice(2, 4), True), (slice(4, 6), True)]
    assert scoring_slices(5, None, balance=False, device=cpu) == [(slice(0, 5), True)]
    # Outside a process group the largest count is this rank's own: nothing to pad.
    assert scoring_slices(3, 2, balance=True, device=cpu) == [(slice(0, 2), True), (slice(2, 4), True)]


@pytest.mark.parametrize("device, cuda, expected", [
    ("cpu", True, "cpu"),  # a use_gpu: false role on a GPU host: a CPU mesh over gloo, not the host's CUDA
    ("cpu", False, "cpu"),
    ("cuda", True, "cuda"),
])
def test_the_fsdp2_mesh_takes_the_role_device_not_the_host_accelerator(device, cuda, expected):
    assert mesh_device_type(torch.device(device), cuda_available=cuda) == expected


def test_a_cuda_role_without_cuda_gets_a_clear_error():
    with pytest.raises(RuntimeError, match="needs CUDA"):
        mesh_device_type(torch.device("cuda"), cuda_available=False)
