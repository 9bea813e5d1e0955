"""Background checkpoint saves of a trained role: ``save_checkpoint(blocking=False)`` returns while its
sharded state is still being written, training goes on, ``finish_checkpoint`` (or the next save) waits
and only then moves the directory into place; the saved state is the one at the save, bit for bit.

Writes are held back by a gate on the storage writer, not by timing: a write cannot finish before the
test opens it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from rlhfctl.trainer import checkpoint
from tests.workers.conftest import local_group
from tests.workers.recipes import tiny_recipe
from tests.workers.test_engine import fixed_batch
from workers import ActorWorker


class WriteGate:
    """Holds every ``torch.distributed.checkpoint`` file write until :meth:`open`; counts the writes let through."""

    def __init__(self) -> None:
        self.opened = threading.Event()
        self.waiting = threading.Event()

    def open(self) -> None:
        self.opened.set()

    def hold(self) -> None:
        self.waiting.set()
        if not self.opened.wait(timeout=120):
            raise TimeoutError("the test never opened the write gate")


@pytest.fixture
def gate(monkeypatch) -> Iterator[WriteGate]:
    """A closed gate on every sharded-state write of this process (opened at the end in any case)."""
    from torch.distributed.checkpoint.filesystem import FileSystemWriter

    gate, write_data = WriteGate(), FileSystemWriter.write_data

    def held_write_data(self, plan, planner):
        gate.hold()
        return write_data(self, plan, planner)

    monkeypatch.setattr(FileSystemWriter, "write_data", held_write_data)
    yield gate
    gate.open()


def trained_state(worker) -> dict[str, torch.Tensor]:
    """Parameters, optimizer state and LR schedule position of a worker, as plain copies."""
    state = {f"param/{name}": p.detach().clone() for name, p in worker.module.named_parameters()}
    for index, entry in worker.optimizer.state_dict()["state"].items():
        state.update({f"optim/{index}/{key}": value.clone() for key, value in entry.items()})
    state["scheduler/last_epoch"] = torch.tensor(worker.scheduler.last_epoch)
    state["counters/update_calls"] = torch.tensor(worker.update_calls)
    return state


def assert_bit_equal(left: dict[str, torch.Tensor], right: dict[str, torch.Tensor]) -> None:
    assert left.keys() == right.keys()
    unequal = [key for key in left if not torch.equal(left[key], right[key])]
    assert unequal == []


@pytest.fixture
def no_process_group():
    """No default process group in this process: a local-backend FSDP2 test that ran earlier in the same pytest
    process (pytest-xdist orders files its own way) keeps the one FSDP2 needs at world size 1."""
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def test_a_background_save_returns_before_its_write_and_training_goes_on(tmp_path, gate, no_process_group):
    with local_group(ActorWorker, tiny_recipe(), "actor") as actor:
        worker = actor.workers[0]
        actor.update_actor(fixed_batch(0))
        (path,) = actor.save_checkpoint(str(tmp_path), blocking=False)
        pending = worker._pending_save
        # Local backend, one rank, no process group: async_save's no_dist path, not a synchronous fallback.
        assert not torch.distributed.is_initialized() and pending.write is not None
        # The write runs on a thread of its own: it reaches the gate some time after the save returns.
        assert gate.waiting.wait(timeout=30) and not pending.written()
        assert not Path(path).exists() and (pending.staging / "hf" / "model.safetensors").is_file()
        actor.update_actor(fixed_batch(1))  # the next step runs while the write is held
        assert not pending.written()
        gate.open()
        assert actor.finish_checkpoint() == [path]
        assert (Path(path) / "state" / ".metadata").is_file() and not pending.staging.exists()
        assert actor.finish_checkpoint() == [None]  # nothing pending any more


def test_the_next_save_finishes_the_previous_one_first(tmp_path, gate):
    with local_group(ActorWorker, tiny_recipe(), "actor") as actor:
        (first,) = actor.save_checkpoint(str(tmp_path / "one"), blocking=False)
        assert not Path(first).exists()  # held: only finishing it moves it into place
        gate.open()
        (second,) = actor.save_checkpoint(str(tmp_path / "two"), blocking=False)
        assert (Path(first) / "state" / ".metadata").is_file()  # the second save completed the first
        assert actor.finish_checkpoint() == [second]


def test_latest_moves_only_once_the_background_write_is_complete(tmp_path, gate):
    def save_roles(directory: Path) -> None:
        actor.save_checkpoint(str(directory), blocking=False)

    with local_group(ActorWorker, tiny_recipe(), "actor") as actor:
        gate.open()
        checkpoint.start_checkpoint(tmp_path, 1, {"step": 1}, save_roles, actor.finish_checkpoint).complete()
        gate.opened.clear()  # hold the next step's write
        actor.update_actor(fixed_batch(0))
        pending = checkpoint.start_checkpoint(tmp_path, 2, {"step": 2}, save_roles, actor.finish_checkpoint)
        assert not actor.workers[0]._pending_save.written()
        # A crash now (the process killed) would resume from step 1: latest still names it.
        assert (tmp_path / "checkpoints" / "latest").read_text() == "step_1"
        assert checkpoint.resume_point("auto", tmp_path).name == "step_1"
        assert not (tmp_path / "checkpoints" / "step_2").exists()
        gate.open()
        assert pending.complete() == tmp_path / "checkpoints" / "step_2"
    assert checkpoint.read_latest(tmp_path).name == "step_2"
    assert (tmp_path / "checkpoints" / "step_2" / "actor" / "state" / ".metadata").is_file()


def test_resuming_a_background_save_gives_the_state_of_a_blocking_one_bit_for_bit(tmp_path, gate):
    with local_group(ActorWorker, tiny_recipe(), "actor") as actor:
        worker = actor.workers[0]
        actor.update_actor(fixed_batch(0))
        at_save = trained_state(worker)
        gate.open()
        actor.save_checkpoint(str(tmp_path / "blocking"))
        gate.opened.clear()
        actor.save_checkpoint(str(tmp_path / "background"), blocking=False)
        actor.update_actor(fixed_batch(1))  # changes the weights in place while the write is held
        gate.open()
        actor.finish_checkpoint()
        actor.load_checkpoint(str(tmp_path / "blocking"))
        from_blocking = trained_state(worker)
        actor.update_actor(fixed_batch(2))
        actor.load_checkpoint(str(tmp_path / "background"))
        from_background = trained_state(worker)
    assert_bit_equal(from_blocking, at_save)
    assert_bit_equal(from_background, from_blocking)
