"""A background checkpoint save at world 2 under FSDP2 with real gloo: the writer thread's collectives run on
their own group while the next update's collectives run on the training group, and the resumed state
equals that of a blocking save, shard for shard. Two spawned processes, no Ray."""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.multiprocessing as mp

from rlhfctl.single_controller.worker import free_port
from tests.workers.recipes import tiny_recipe
from tests.workers.test_async_checkpoint import WriteGate, assert_bit_equal
from tests.workers.test_engine import fixed_batch

WORLD = 2


def local_state(worker) -> dict[str, torch.Tensor]:
    """This rank's shards of the parameters and optimizer state, and the schedule position, as copies."""
    def local(tensor: torch.Tensor) -> torch.Tensor:
        return (tensor.to_local() if hasattr(tensor, "to_local") else tensor).detach().clone()

    state = {f"param/{name}": local(p) for name, p in worker.module.named_parameters()}
    for index, entry in worker.optimizer.state_dict()["state"].items():
        state.update({f"optim/{index}/{key}": local(value) for key, value in entry.items()})
    state["scheduler/last_epoch"] = torch.tensor(worker.scheduler.last_epoch)
    return state


def _rank(rank: int, port: int, directory: str) -> None:
    """One rank: update, save blocking and in the background (held, then training on), reload both, compare."""
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(WORLD), "LOCAL_RANK": str(rank),
                       "LOCAL_WORLD_SIZE": str(WORLD), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    torch.set_num_threads(1)
    from torch.distributed.checkpoint.filesystem import FileSystemWriter

    from workers import ActorWorker

    gate, write_data = WriteGate(), FileSystemWriter.write_data
    FileSystemWriter.write_data = lambda self, plan, planner: (gate.hold(), write_data(self, plan, planner))[1]
    worker = ActorWorker(tiny_recipe(roles={"actor": {"strategy": "fsdp2"}}), "actor")
    worker.init_model()
    worker.update_actor(fixed_batch(0).chunk(WORLD)[rank])
    at_save = local_state(worker)
    gate.open()
    worker.save_checkpoint(str(Path(directory) / "blocking"))
    gate.opened.clear()
    worker.save_checkpoint(str(Path(directory) / "background"), blocking=False)
    assert not worker._pending_save.written()
    worker.update_actor(fixed_batch(1).chunk(WORLD)[rank])  # FSDP2 collectives while the save is pending
    gate.open()
    worker.update_actor(fixed_batch(2).chunk(WORLD)[rank])  # and while it writes and exchanges its results
    worker.finish_checkpoint()
    worker.load_checkpoint(str(Path(directory) / "blocking"))
    from_blocking = local_state(worker)
    worker.load_checkpoint(str(Path(directory) / "background"))
    assert_bit_equal(from_blocking, at_save)
    assert_bit_equal(local_state(worker), from_blocking)
    torch.distributed.destroy_process_group()


def test_a_world_2_fsdp2_background_save_resumes_bit_equal_to_a_blocking_one(tmp_path):
    mp.spawn(_rank, args=(free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    info = (tmp_path / "background" / "actor" / "checkpoint.json").read_text()
    assert '"strategy": "fsdp2"' in info and '"world_size": 2' in info
    assert len(list((tmp_path / "background" / "actor" / "state").glob("*.distcp"))) == WORLD
