"""Actor and rollout workers that show their vLLM engine's shards, for the tensor-parallel tests (pytest -m vllm)."""

from __future__ import annotations

from typing import Any

from rlhfctl.single_controller import Dispatch, register
from workers import ActorWorker
from workers.rollout_worker import RolloutWorker


_PARTITION = ("num_embeddings_per_partition", "output_size_per_partition", "input_size_per_partition")


def _partitions(model: Any) -> dict[str, dict[str, int]]:
    """Each parallel layer's share on this rank (vocabulary rows, outputs, inputs), read from the layers, as the CPU
    backend may repack the weight tensors themselves."""
    return {name: {key: int(getattr(module, key)) for key in _PARTITION if hasattr(module, key)}
            for name, module in model.named_modules() if any(hasattr(module, key) for key in _PARTITION)}


def _engine_shapes(engine: Any) -> dict[str, Any]:
    """The engine's tensor-parallel size and each parallel layer's share on this rank."""
    shapes = engine.llm.apply_model(_partitions)
    return {"tensor_parallel_size": engine.tensor_parallel_size, "shapes": shapes[0] if isinstance(shapes, list) else shapes}


class ShardsActor(ActorWorker):
    """ActorWorker plus ``engine_shards``: what this rank's engine holds."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def engine_shards(self) -> dict[str, Any]:
        """This rank's engine: tensor-parallel size and parameter shapes."""
        return _engine_shapes(self.rollout_engine)


class ShardsRollout(RolloutWorker):
    """RolloutWorker plus ``engine_shards``: what this rank's engine holds."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def engine_shards(self) -> dict[str, Any]:
        """This rank's engine: tensor-parallel size and parameter shapes."""
        return _engine_shapes(self.rollout_engine)
