"""TrainableRoleWorker: checkpoint save/load and the weight fingerprint, shared by actor and critic."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from rlhfctl.single_controller import Dispatch, register
from workers.checkpointing import load_role_state, role_directory, save_role_state
from workers.seeding import gather_rng_states
from workers.role import RoleWorker
from workers.training import distributed, trainable_parameters

__all__ = ["TrainableRoleWorker"]


class TrainableRoleWorker(RoleWorker):
    """A role with a model, optimizer and scheduler; subclasses build them in ``init_model``.

    ``module`` is the model itself, ``model`` what training runs through (DDP(module) or module).
    ``counter_names`` lists the integer attributes saved with checkpoints (call counters that seed
    sampling and shuffling), so a resumed run continues the same random streams.
    """

    counter_names: tuple[str, ...] = ()

    def __init__(self, recipe: Any, role: str | None = None) -> None:
        super().__init__(recipe, role)
        self.module: nn.Module | None = None
        self.model: nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: Any = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, directory: str) -> str:
        """Rank 0 writes ``<directory>/<role>/`` (weights or adapter, optimizer, scheduler, every rank's RNG); returns it."""
        self._require_model()
        target = role_directory(directory, self.role)
        error: BaseException | None = None
        rank_rng = gather_rng_states()  # a collective: every rank sends its own RNG state to rank 0
        if self.rank == 0:
            try:
                save_role_state(
                    target,
                    model=self.module,
                    optimizer=self.optimizer,
                    scheduler=self.scheduler,
                    counters={name: int(getattr(self, name)) for name in self.counter_names},
                    info={"role": self.role, "worker": f"{type(self).__module__}.{type(self).__qualname__}"},
                    rank_rng=rank_rng,
                )
            except Exception as caught:  # noqa: BLE001 - re-raised after the barrier so no rank hangs
                error = caught
        if distributed():
            dist.barrier()
        if error is not None:
            raise error
        return str(target)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, directory: str) -> None:
        """Every rank restores ``<directory>/<role>/`` written by ``save_checkpoint``, with its own RNG state."""
        self._require_model()
        counters = load_role_state(
            role_directory(directory, self.role),
            model=self.module,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            device=self.device,
            rank=self.rank,
        )
        for name in self.counter_names:
            if name in counters:
                setattr(self, name, counters[name])

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def state_fingerprint(self) -> float:
        """Sum of all trainable parameters as a float (tests compare it across ranks)."""
        self._require_model()
        with torch.no_grad():
            return float(sum(parameter.double().sum().item() for parameter in trainable_parameters(self.module)))
