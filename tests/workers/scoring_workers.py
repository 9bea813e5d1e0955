"""Role workers plus one method each, for the scoring and offload tests: a rank's own uneven share of a
batch scored both ways (per-unit FSDP2 unshard, and the whole-model gather of ``serving``), and where the
role's state lives between calls."""

from __future__ import annotations

from typing import Any

import torch

from rlhfctl.protocol import DataProto
from rlhfctl.single_controller import Dispatch, register
from workers import ActorWorker, CriticWorker, ReferenceWorker, RewardWorker
from workers.critic import response_values
from rlhfctl.engine.placement import scoring, serving


def own_rows(data: DataProto, rows: list[int], rank: int) -> DataProto:
    """Rank ``rank``'s share when rank i holds ``rows[i]`` consecutive rows."""
    start = sum(rows[:rank])
    return DataProto.from_dict({key: value[start : start + rows[rank]] for key, value in data.batch.items()})


class _Forwards:
    """Counts the model's forward calls in a block (every rank must run as many under per-unit unshard)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.count, self.module = 0, module

    def __enter__(self) -> "_Forwards":
        self.handle = self.module.register_forward_pre_hook(self.seen)
        return self

    def seen(self, *args: Any) -> None:
        self.count += 1

    def __exit__(self, *exc: Any) -> None:
        self.handle.remove()


def storage_places(module: torch.nn.Module, optimizer: torch.optim.Optimizer | None, hold: list | None = None) -> dict[str, Any]:
    """Devices and storage addresses of the local parameter shards and of the AdamW moments; ``hold`` keeps
    the tensors alive, so that a later copy cannot reuse one of these addresses."""
    from torch.distributed.tensor import DTensor

    def local(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to_local() if isinstance(tensor, DTensor) else tensor

    params = [local(p) for p in module.parameters()]
    moments = [local(v) for state in (optimizer.state.values() if optimizer else []) for v in state.values()
               if isinstance(v, torch.Tensor) and v.dim() > 0]
    if hold is not None:
        hold.extend(params + moments)
    return {
        "param_devices": sorted({str(p.device) for p in params}),
        "param_pointers": [p.untyped_storage().data_ptr() for p in params],
        "moment_devices": sorted({str(m.device) for m in moments}),
        "moment_pointers": [m.untyped_storage().data_ptr() for m in moments],
    }


class ScoringActor(ActorWorker):
    """ActorWorker plus ``uneven_log_probs`` and ``storage``."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def uneven_log_probs(self, data: DataProto, rows: list[int]) -> dict[str, Any]:
        """This rank's rows scored per unit (as ``compute_log_prob`` does) and whole-model gathered, with
        the forward count of the per-unit pass."""
        mine = own_rows(data, rows, self.rank)
        self.module.eval()
        with _Forwards(self.module) as forwards, scoring(self.module, self.engine):
            per_unit, per_unit_entropy = self._response_log_probs(mine, with_entropy=True)
        with serving(self.module, self.engine):
            gathered, gathered_entropy = self._response_log_probs(mine, with_entropy=True)
        return {"per_unit": per_unit, "gathered": gathered, "per_unit_entropy": per_unit_entropy,
                "gathered_entropy": gathered_entropy, "forwards": forwards.count}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def storage(self) -> dict[str, Any]:
        """Where the parameter shards and AdamW moments live now (between calls); holds them until the next."""
        held: list = []
        places = storage_places(self.module, self.optimizer, held)
        self.held = held
        return places


class ScoringCritic(CriticWorker):
    """CriticWorker plus ``uneven_values``."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def uneven_values(self, data: DataProto, rows: list[int]) -> dict[str, Any]:
        """This rank's rows through ``compute_values`` (per unit, micro-batched) and through one whole-model
        gathered forward, with the forward count of the first."""
        mine = own_rows(data, rows, self.rank)
        with _Forwards(self.module) as forwards:
            per_unit = self.compute_values(mine).batch["values"]
        with serving(self.module, self.engine), torch.no_grad():
            gathered = response_values(self.module, mine.batch) * mine.batch["response_mask"]
        return {"per_unit": per_unit, "gathered": gathered, "forwards": forwards.count}


class PlacedReference(ReferenceWorker):
    """ReferenceWorker plus ``storage``."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def storage(self) -> dict[str, Any]:
        """Where the parameter shards live now (between calls); holds them until the next."""
        held: list = []
        places = storage_places(self.model, None, held)
        self.held = held
        return places


class ScoringReward(RewardWorker):
    """RewardWorker (a sequence-classifier model) plus ``uneven_scores``."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def uneven_scores(self, texts: list[str], rows: list[int]) -> dict[str, Any]:
        """This rank's texts scored per unit (``roles.reward.batch_size`` at a time) and whole-model gathered,
        with the forward count of the per-unit pass."""
        start = sum(rows[: self.rank])
        mine = texts[start : start + rows[self.rank]]
        with _Forwards(self.model) as forwards:
            per_unit = self._model_scores([""] * len(mine), mine)
        with serving(self.model, self.engine):  # scoring() inside serving() keeps the units whole
            gathered = self._model_scores([""] * len(mine), mine)
        return {"per_unit": per_unit, "gathered": gathered, "forwards": forwards.count}
