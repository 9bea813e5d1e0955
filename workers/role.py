"""RoleWorker: what every role worker shares: its recipe, role name, device, seed and process set-up."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from rlhfctl.protocol import DataProto
from rlhfctl.single_controller import Worker
from rlhfctl.engine.placement import EngineSettings, engine_settings, materialize
from rlhfctl.engine.packing import use_padding_free
from rlhfctl.recipe.resolve import ROLLOUT_ROLE
from rlhfctl.recipe.resolved import resolve_mapping
from rlhfctl.recipe.specs import Recipe, RoleSpec
from rlhfctl.engine.seeding import derive_seed, seed_everything

__all__ = ["RoleWorker"]


class RoleWorker(Worker):
    """Base of the built-in role workers: constructed as ``Cls(recipe, role)``.

    ``recipe`` is the resolved :class:`~rlhfctl.recipe.specs.Recipe` (plain recipe data is resolved here, for
    tests and scripts); the worker reads its role's :class:`~rlhfctl.recipe.specs.RoleSpec` (``self.spec``) and
    the shared sections it needs. Models are built later, in ``init_model``.
    """

    default_role = "worker"

    def __init__(self, recipe: Recipe | Mapping[str, Any], role: str | None = None) -> None:
        super().__init__()
        if not isinstance(recipe, (Recipe, Mapping)):
            raise TypeError(f"{type(self).__name__} takes the resolved Recipe (or recipe data), got {type(recipe).__name__}")
        self.role = role or self.default_role
        self.recipe: Recipe = recipe if isinstance(recipe, Recipe) else resolve_mapping(recipe, self.role)
        self.spec: RoleSpec | None = self.recipe.roles.get(self.role)
        self.seed = int(self.recipe.trainer.seed)
        self.device = torch.device("cuda") if self._uses_gpu() else torch.device("cpu")
        self.tokenizer: Any = None
        self.engine: EngineSettings | None = None

    def _uses_gpu(self) -> bool:
        """Whether this role's pool reserves GPUs (the rollout group's pool is ``rollout.pool``)."""
        if self.spec is not None:
            return self.spec.use_gpu
        pool = self.recipe.pools.get(self.recipe.rollout.pool or "") if self.role == ROLLOUT_ROLE else None
        return bool(pool is not None and pool.use_gpu)

    def _place_model(
        self, build: Callable[[Mapping[str, Any]], nn.Module], model_cfg: Mapping[str, Any], *, trainable: bool
    ) -> tuple[nn.Module, nn.Module]:
        """Join the process group the strategy needs, then build and place the model (``rlhfctl.engine.placement``);
        returns ``(module, model)``: the model itself and what training runs through."""
        self.engine = engine_settings(self.recipe, self.role, model_cfg["dtype"], self.world_size, trainable=trainable)
        self._setup_process(distributed=trainable or self.engine.strategy == "fsdp2")
        return materialize(build, model_cfg, self.engine, self.device)

    def _setup_process(self, distributed: bool) -> None:
        """Check the device, seed the global RNGs and, for DDP roles with world_size > 1, join the group."""
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(
                f"role '{self.role}' runs in a resource pool with use_gpu: true, but this process sees no CUDA "
                "device; set use_gpu: false or run on a GPU node"
            )
        seed_everything(derive_seed(self.seed, self.rank, self.role))
        if distributed and self.world_size > 1:
            self.init_distributed(backend="nccl" if self.device.type == "cuda" else "gloo")
        if self.device.type == "cuda":
            # Ray isolates one GPU per rank (device 0); init_distributed may have picked another.
            self.device = torch.device("cuda", torch.cuda.current_device())

    def padding_free(self, model: torch.nn.Module) -> bool:
        """Whether ``model`` runs micro-batches packed: ``roles.<role>.padding_free`` (null: where it can)."""
        setting = self.spec.settings.get("padding_free") if self.spec is not None else None
        return use_padding_free(setting, model, f"roles.{self.role}.padding_free")

    def micro_batch_tokens(self) -> int | None:
        """``roles.<role>.micro_batch_tokens``: the token budget of a training micro-batch (null: by rows)."""
        value = self.spec.settings.get("micro_batch_tokens") if self.spec is not None else None
        return int(value) if value else None

    def _require_model(self, attribute: str = "model") -> None:
        if getattr(self, attribute, None) is None:
            raise RuntimeError(f"{type(self).__name__} ({self.role}): call init_model() first")

    @staticmethod
    def _require_keys(data: DataProto, keys: tuple[str, ...], method: str) -> None:
        missing = [key for key in keys if key not in data.batch]
        if missing:
            raise KeyError(f"{method} needs tensors {missing}; the batch has {sorted(data.batch)}")
