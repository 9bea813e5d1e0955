"""An actor that shows the vLLM sync's gathered weights (rlhfctl/rollout/vllm_engine.py) without vLLM."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from rlhfctl.single_controller import Dispatch, register
from workers import ActorWorker
from rlhfctl.rollout.vllm_engine import gathered_weights

_GATHERS = ("all_gather_tensor", "all_gather_single", "all_gather_tensor_autograd")


@contextlib.contextmanager
def recorded_gathers(sent: list[tuple[str, int]]) -> Iterator[None]:
    """Record (dtype, elements) of every functional all-gather's local input (what DTensor.full_tensor sends)."""
    import torch.distributed._functional_collectives as funcol

    originals = {name: getattr(funcol, name) for name in _GATHERS if hasattr(funcol, name)}

    def recording(original: Any) -> Any:
        def gather(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            sent.append((str(tensor.dtype), int(tensor.numel())))
            return original(tensor, *args, **kwargs)

        return gather

    for name, original in originals.items():
        setattr(funcol, name, recording(original))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(funcol, name, original)


class SyncWeightsActor(ActorWorker):
    """ActorWorker plus one method: the sync's weights in the engine's dtype, cast before and after the gather."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def synced_weights(self, dtype: str) -> dict[str, Any]:
        """{"cast_first": the sync's tensors, "cast_after": gathered in the masters' dtype then cast (the old
        sync), "sent": bytes each rank's all-gathers carried per dtype for cast_first, "masters": the masters' dtypes}."""
        target = getattr(torch, dtype)
        bucket = 2**16  # small buckets: several of them, as on a real model
        sent: list[tuple[str, int]] = []
        with recorded_gathers(sent):
            cast_first = {name: tensor.clone() for name, tensor in gathered_weights(self.module, bucket, target)}
        cast_after = {name: tensor.to(target) for name, tensor in gathered_weights(self.module, bucket)}
        masters = sorted({str(parameter.dtype) for parameter in self.module.parameters()})
        sent_bytes: dict[str, int] = {}
        for name, elements in sent:
            sent_bytes[name] = sent_bytes.get(name, 0) + elements * getattr(torch, name.removeprefix("torch.")).itemsize
        return {"cast_first": cast_first, "cast_after": cast_after, "sent": sent_bytes, "masters": masters}
