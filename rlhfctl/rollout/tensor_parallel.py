"""Which ranks form one vLLM engine: the tensor-parallel layout of a world, shared by the engine
(:mod:`rlhfctl.rollout.vllm_engine`) and the recipe's check (``rlhfctl/recipe/check_tensor_parallel.py``).

Standard library only, so that neither side imports the other.
"""

from __future__ import annotations

__all__ = ["engine_groups"]


def engine_groups(world_size: int, tensor_parallel_size: int) -> list[list[int]]:
    """The ranks of each engine: consecutive blocks of ``tensor_parallel_size`` (vLLM's own TP layout of a world)."""
    t = max(1, int(tensor_parallel_size))
    return [list(range(start, min(start + t, int(world_size)))) for start in range(0, int(world_size), t)]
