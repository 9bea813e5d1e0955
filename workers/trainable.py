"""TrainableRoleWorker: checkpoint save/load, the Hugging Face export and the weight fingerprint, shared
by the trained roles (actor, critic, reward model)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from rlhfctl.models.loading import load_tokenizer, resolve_dtype
from rlhfctl.protocol import DataProto
from rlhfctl.recipe.resolve import export_dtype
from rlhfctl.single_controller import Dispatch, register
from rlhfctl.engine.checkpointing import (PendingRoleSave, checkpoint_group, load_role_state, role_directory, save_hf_directory,
                                  start_role_save)
from rlhfctl.engine.placement import ONE_TO_ALL_FIRST, local_state_bytes
from workers.role import RoleWorker
from rlhfctl.engine.seeding import gather_rng_states, make_generator
from rlhfctl.engine.training import (LossFn, build_optimizer, build_scheduler, check_same_across_ranks,
                              enable_activation_checkpointing, optimize_on_batch, trainable_parameters)

__all__ = ["TrainableRoleWorker"]


class TrainableRoleWorker(RoleWorker):
    """A role with a model, optimizer and scheduler; subclasses build them in ``init_model``.

    ``module`` is the model itself (sharded in place under FSDP2), ``model`` what training runs through
    (DDP(module), or module). ``counter_names`` lists the integer attributes saved with checkpoints (call
    counters that seed sampling and shuffling), so a resumed run continues the same random streams.
    """

    counter_names: tuple[str, ...] = ()

    def __init__(self, recipe: Any, role: str | None = None) -> None:
        super().__init__(recipe, role)
        self.module: nn.Module | None = None
        self.model: nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: Any = None
        self._pending_save: PendingRoleSave | None = None  # a save_checkpoint(blocking=False) still writing
        self._save_group: Any = None  # the gloo group of this role's background checkpoint writes

    def _export_dtype(self) -> torch.dtype:
        """The dtype of the Hugging Face export: ``trainer.export_dtype``, else the role's compute dtype."""
        return resolve_dtype(export_dtype(self.recipe.trainer, self.engine.compute_dtype))  # type: ignore[return-value]

    def _write_hf(self, target: Path) -> Path:
        return save_hf_directory(self.module, self.tokenizer, target, self._export_dtype())

    def _init_trained_model(self) -> None:
        """Tokenizer, the model from ``_build_model`` placed by the role's strategy, optimizer and LR schedule."""
        trust = bool(self.model_cfg["trust_remote_code"])
        self.tokenizer = load_tokenizer(self.model_cfg, trust_remote_code=trust)
        self.module, self.model = self._place_model(self._build_model, self.model_cfg, trainable=True)
        self.optimizer = build_optimizer(self.module, self.optim_cfg)
        self.scheduler = build_scheduler(self.optimizer, self.optim_cfg, self.recipe.trainer.total_steps)

    def _load_trained(self, loader: Callable[..., nn.Module], model_cfg: Mapping[str, Any]) -> nn.Module:
        """``loader(model_cfg, ...)`` in the engine's storage dtype and this rank's seed, with activation
        checkpointing when the recipe asks: the one way each trained role builds its model."""
        model = loader(model_cfg, self.tokenizer, dtype=self.engine.storage_dtype,
                       trust_remote_code=bool(model_cfg["trust_remote_code"]), seed=self.seed)
        if model_cfg["gradient_checkpointing"]:
            enable_activation_checkpointing(model)
        return model

    def _start_update(self, data: DataProto, keys: tuple[str, ...], method: str, unit: str = "rows") -> float:
        """What every update call checks first (model built, columns present, the same row count on every
        rank, lest a collective hang); puts the model in train mode and returns the learning rate of this step."""
        self._require_model()
        self._require_keys(data, keys, method)
        check_same_across_ranks(len(data), f"the number of {unit} in {method}", self.device)
        self.model.train()
        return float(self.scheduler.get_last_lr()[0])

    def _optimize(
        self,
        batch: Mapping[str, torch.Tensor],
        loss_fn: LossFn,
        *,
        stream: str,
        row_tokens: torch.Tensor,
        loss_tokens: torch.Tensor | None = None,
        epochs: int = 1,
        mini_batch_rows: int | None = None,
        micro_batch_rows: int | None = None,
        after_step: Callable[[], None] | None = None,
    ) -> dict[str, float]:
        """One update call: :func:`rlhfctl.engine.training.optimize_on_batch` with this role's model, optimizer,
        clipping and token budget, shuffled by the ``(seed, rank, stream, update call)`` stream; then the LR
        schedule steps and the update counter moves on. ``mini_batch_rows`` defaults to the whole batch."""
        rows = next(iter(batch.values())).shape[0]
        metrics = optimize_on_batch(
            batch,
            model=self.model,
            optimizer=self.optimizer,
            loss_fn=loss_fn,
            device=self.device,
            epochs=epochs,
            mini_batch_rows=mini_batch_rows or rows,
            micro_batch_rows=micro_batch_rows,
            grad_clip=self.optim_cfg["grad_clip"],
            generator=make_generator("cpu", self.seed, self.rank, stream, self.update_calls),
            micro_batch_tokens=self.micro_batch_tokens(),
            row_tokens=row_tokens,
            loss_tokens=loss_tokens,
            budget_key=f"roles.{self.role}.micro_batch_tokens",
            after_step=after_step,
        )
        self.scheduler.step()
        self.update_calls += 1
        return metrics

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, directory: str, blocking: bool = True) -> str:
        """Every rank writes its shards of ``<directory>/<role>/`` (plus rank 0 the HF directory); returns it.

        With ``blocking=False`` the sharded state is copied to CPU memory and written in the background:
        the call returns once the copy and the HF directory are done, and ``finish_checkpoint`` waits for
        the write and moves the directory into place. A save still writing is finished first.
        """
        self._require_model()
        self.finish_checkpoint()
        target = role_directory(directory, self.role)
        rank_rng = gather_rng_states()  # a collective: every rank sends its own RNG state to rank 0
        if not blocking and self._save_group is None:
            self._save_group = checkpoint_group()  # a collective too, once per role
        pending = start_role_save(
            target,
            module=self.module,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            counters={name: int(getattr(self, name)) for name in self.counter_names},
            info={"role": self.role, "worker": f"{type(self).__module__}.{type(self).__qualname__}",
                  "strategy": self.engine.strategy if self.engine else None, "world_size": self.world_size},
            write_hf=self._write_hf,
            rank_rng=rank_rng,
            asynchronous=not blocking,
            process_group=self._save_group,
        )
        if blocking:
            return str(pending.complete())
        self._pending_save = pending
        return str(target)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def finish_checkpoint(self) -> str | None:
        """Every rank waits for a ``save_checkpoint(blocking=False)`` still writing and moves it into place; its path, or None."""
        pending, self._pending_save = self._pending_save, None
        return None if pending is None else str(pending.complete())

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, directory: str) -> None:
        """Every rank restores ``<directory>/<role>/`` written by ``save_checkpoint`` (at any world size)."""
        self._require_model()
        self.finish_checkpoint()
        counters = load_role_state(
            role_directory(directory, self.role),
            module=self.module,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            device=self.device,
            rank=self.rank,
        )
        for name in self.counter_names:
            if name in counters:
                setattr(self, name, counters[name])

    @register(dispatch_mode=ONE_TO_ALL_FIRST)
    def export_hf(self, directory: str) -> str:
        """Write a plain Hugging Face model directory (gathered from the shards, LoRA merged) with the tokenizer."""
        self._require_model()
        return str(self._write_hf(Path(os.path.expanduser(str(directory)))))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def state_fingerprint(self) -> float:
        """Sum of all trainable parameters as a float, over every shard (tests compare it across ranks)."""
        self._require_model()
        with torch.no_grad():
            local = sum(
                (p.to_local() if isinstance(p, DTensor) else p).double().sum().item() for p in trainable_parameters(self.module)
            )
            if any(isinstance(p, DTensor) for p in trainable_parameters(self.module)):
                total = torch.tensor([local], dtype=torch.float64, device=self.device)
                dist.all_reduce(total)
                return float(total.item())
        return float(local)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def state_bytes(self) -> dict[str, int]:
        """Bytes of parameters, gradients and optimizer state this rank holds (local shards under FSDP2)."""
        self._require_model()
        return local_state_bytes(self.module, self.optimizer)
