"""Round batching of the endpoint's requests: the running programs' requests go to the engine together.

The engine side is the rollout's own :data:`~rlhfctl.agents.llm.BatchGenerate` (the hf decoding loop or the vLLM
engine, as for every agent loop). A round goes to the engine when every running program has a request waiting,
or ``wait_s`` after its first request arrived, whichever is first: a program busy between requests (running its
own tool, say) holds the others back at most ``wait_s``. A program counts as running from :meth:`join` until its
handle's ``leave``; one that has not joined (waiting for ``max_concurrency``) holds nobody back.

An engine failure is not a program's fault: every request of the round gets it (the endpoint answers HTTP 500),
later requests fail at once, and :attr:`error` keeps it for the rollout to raise.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from rlhfctl.agents.llm import BatchGenerate, Generation, GenerationRequest

__all__ = ["EngineFailure", "SessionBatcher", "SessionLLM"]


class EngineFailure(RuntimeError):
    """The engine raised during a round; ``__cause__`` is its error."""


class SessionBatcher:
    """Collects the running programs' generate calls into rounds on one engine (see the module docstring)."""

    def __init__(self, batch_generate: BatchGenerate, wait_s: float) -> None:
        self.batch_generate = batch_generate
        self.wait_s = float(wait_s)
        self.running = 0
        self.pending: list[tuple[GenerationRequest, asyncio.Future]] = []
        self.rounds: list[int] = []
        """How many requests each round held."""
        self.seconds = 0.0
        """Time spent inside the engine's batch calls."""
        self.error: BaseException | None = None
        self._timer: asyncio.TimerHandle | None = None

    def join(self, order: int) -> "SessionLLM":
        """A program starts: its handle, and the rounds wait for it from now on (until its ``leave``)."""
        self.running += 1
        return SessionLLM(self, int(order))

    async def _request(self, request: GenerationRequest) -> Generation:
        if self.error is not None:
            raise EngineFailure(f"the engine failed in an earlier round: {self.error}") from self.error
        future = asyncio.get_running_loop().create_future()
        self.pending.append((request, future))
        if len(self.pending) >= self.running:
            self._flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.wait_s, self._flush)
        return await future

    def _leave(self) -> None:
        self.running -= 1
        if self.pending and len(self.pending) >= self.running:
            self._flush()

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch = [item for item in self.pending if not item[1].done()]  # a request whose client gave up still ran
        self.pending = []
        if not batch:
            return
        batch.sort(key=lambda item: item[0].order)  # the order of a round's rows does not depend on arrival
        self.rounds.append(len(batch))
        start = time.perf_counter()
        try:  # inline: the programs whose requests are here wait on it anyway, the others run in their threads
            results = self._generate([request for request, _ in batch])
        except Exception as problem:  # every request of the round is answered, none is left hanging
            self.error = problem
            failure = EngineFailure(f"the engine failed: {type(problem).__name__}: {problem}")
            failure.__cause__ = problem
            for _, future in batch:
                future.set_exception(failure)
            return
        finally:
            self.seconds += time.perf_counter() - start
        for (_, future), result in zip(batch, results):
            if not future.done():
                future.set_result(result)

    def _generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        results = self.batch_generate(list(requests))
        if len(results) != len(requests):
            raise RuntimeError(f"the engine returned {len(results)} generations for {len(requests)} requests")
        return results


class SessionLLM:
    """One program's handle on a :class:`SessionBatcher` (the ``llm`` its session samples through)."""

    def __init__(self, shared: SessionBatcher, order: int) -> None:
        self.shared, self.order, self._left = shared, order, False

    async def generate(self, token_ids: Sequence[int], *, max_tokens: int, **sampling: Any) -> Generation:
        """Sample up to ``max_tokens`` new tokens after ``token_ids``, in the next round (the rollout's sampling settings)."""
        if sampling:
            raise ValueError(f"per-request sampling settings ({', '.join(sorted(sampling))}) are not supported")
        if max_tokens < 1:
            return Generation([], [], finished=False)
        return await self.shared._request(GenerationRequest(self.order, [int(token) for token in token_ids], int(max_tokens)))

    def leave(self) -> None:
        """The program is done: the rounds no longer wait for it (idempotent)."""
        if not self._left:
            self._left = True
            self.shared._leave()
