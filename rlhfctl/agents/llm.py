"""What an agent loop calls to sample: ``await llm.generate(token_ids, **sampling) -> Generation``.

Token ids go in (the whole context so far: prompt, earlier turns, tool outputs) and the new token ids
come out with the engine's log-probability of each, so a trajectory holds exactly the tokens the
engine generated (never decoded and re-encoded).

:class:`RoundBatchedLLM` is the engine every rollout worker gives its loops. Each trajectory of a step
runs as its own coroutine; their ``generate`` calls are held until every live trajectory is waiting
for one, then go to the engine as one batch (the hf engine left-pads them into one decoding loop; the
vllm engine takes them as one list and schedules them itself). A trajectory busy with a tool holds
the round back, at most ``tool_timeout_s``; a finished one leaves it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["BatchGenerate", "Generation", "GenerationRequest", "LLM", "RoundBatchedLLM"]


@dataclass(frozen=True)
class Generation:
    """What one generate call gives back: the new tokens (EOS included when one was sampled) and their log-probs."""

    token_ids: list[int]
    log_probs: list[float]
    finished: bool = True
    """True when the turn ended with an EOS token; False when it ran out of ``max_tokens``."""


@dataclass(frozen=True)
class GenerationRequest:
    """One pending generate call: ``order`` (the trajectory's index) fixes its row in the batch."""

    order: int
    token_ids: list[int]
    max_tokens: int
    sampling: dict[str, Any] = field(default_factory=dict)


class LLM(Protocol):
    """The engine interface an :class:`~rlhfctl.agents.loop.AgentLoop` samples through."""

    async def generate(self, token_ids: Sequence[int], *, max_tokens: int, **sampling: Any) -> Generation:
        """Sample a continuation of ``token_ids`` of at most ``max_tokens`` tokens (the rollout's sampling
        settings; the rollout workers' engine refuses per-call ``sampling`` keywords for now)."""
        ...


BatchGenerate = Callable[[list[GenerationRequest]], list[Generation]]
"""The engine's side: one call per round, one :class:`Generation` per request, in the requests' order."""


class RoundBatchedLLM:
    """Holds each coroutine's ``generate`` until every live trajectory waits, then runs them as one batch.

    ``bind(order)`` gives a trajectory its own handle (its ``order`` is its row in every batch, so a batch
    is laid out the same way whatever order the coroutines asked in); ``leave()`` on that handle, when
    the trajectory ends, lets the others go on without it. Rounds are sorted by ``order``, which keeps
    seeded sampling reproducible.
    """

    def __init__(self, batch_generate: BatchGenerate, live: int) -> None:
        self.batch_generate = batch_generate
        self.live = int(live)
        self.pending: list[tuple[GenerationRequest, asyncio.Future]] = []
        self.rounds: list[int] = []
        """How many requests each batch held (for tests and the benchmark)."""
        self.seconds = 0.0
        """Time spent inside the engine's batch calls."""

    def bind(self, order: int) -> "_BoundLLM":
        """The handle one trajectory's loop samples through."""
        return _BoundLLM(self, int(order))

    async def _request(self, request: GenerationRequest) -> Generation:
        future = asyncio.get_running_loop().create_future()
        self.pending.append((request, future))
        self._flush_if_ready()
        return await future

    def _leave(self) -> None:
        self.live -= 1
        self._flush_if_ready()

    def _flush_if_ready(self) -> None:
        if not self.pending or len(self.pending) < self.live:
            return
        batch, self.pending = sorted(self.pending, key=lambda item: item[0].order), []
        self.rounds.append(len(batch))
        start = time.perf_counter()
        try:  # every live trajectory waits on this batch, so running it inline blocks nothing else
            results = self.batch_generate([request for request, _ in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"the engine returned {len(results)} generations for {len(batch)} requests")
        except Exception as problem:  # handed to every waiting trajectory, none is left hanging
            for _, future in batch:
                future.set_exception(problem)
            return
        finally:
            self.seconds += time.perf_counter() - start
        for (_, future), result in zip(batch, results):
            future.set_result(result)


class _BoundLLM:
    """One trajectory's view of a :class:`RoundBatchedLLM` (what a loop's ``llm`` argument is)."""

    def __init__(self, shared: RoundBatchedLLM, order: int) -> None:
        self.shared, self.order, self._left = shared, order, False

    async def generate(self, token_ids: Sequence[int], *, max_tokens: int, **sampling: Any) -> Generation:
        """Sample up to ``max_tokens`` new tokens after ``token_ids`` (batched with the other trajectories)."""
        if sampling:  # the engines sample every round with the rollout's settings
            raise ValueError(
                f"llm.generate: per-call sampling settings ({', '.join(sorted(sampling))}) are not supported; every "
                "turn samples with rollout.temperature, top_p, top_k and do_sample"
            )
        if max_tokens < 1:
            return Generation([], [], finished=False)
        request = GenerationRequest(self.order, [int(token) for token in token_ids], int(max_tokens), dict(sampling))
        return await self.shared._request(request)

    def leave(self) -> None:
        """This trajectory is done: the rounds no longer wait for it (idempotent)."""
        if not self._left:
            self._left = True
            self.shared._leave()
