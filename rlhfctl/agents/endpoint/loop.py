"""The endpoint as an agent loop: ``rollout.agent_server.program`` runs each sample, through an OpenAI-compatible API.

:class:`EndpointAgentLoop` is an :class:`~rlhfctl.agents.loop.AgentLoop`, so its trajectories go through the same
batch layout, masks, rewards and metrics as the tool loop's. A rollout call runs :meth:`EndpointAgentLoop.run_batch`:
one endpoint for all of the call's samples, up to ``max_concurrency`` programs at once, their requests in rounds on
the rank's engine (:class:`~rlhfctl.agents.endpoint.batcher.SessionBatcher`); the endpoint closes when the call
ends. :meth:`EndpointAgentLoop.run` runs one sample with an endpoint of its own, on any
:class:`~rlhfctl.agents.llm.LLM`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from rlhfctl.agents.endpoint.batcher import SessionBatcher
from rlhfctl.agents.endpoint.program import Program, abandoned_threads, load_program
from rlhfctl.agents.endpoint.server import AgentEndpoint, EndpointRun
from rlhfctl.agents.endpoint.settings import EndpointSettings
from rlhfctl.agents.llm import BatchGenerate
from rlhfctl.agents.loop import AgentContext, AgentLoop, AgentSample
from rlhfctl.agents.trajectory import Trajectory

__all__ = ["EndpointAgentLoop"]

logger = logging.getLogger(__name__)


class EndpointAgentLoop(AgentLoop):
    """Each sample is one run of the agent program against the endpoint; its recorded tokens are the trajectory."""

    def __init__(self, context: AgentContext, settings: EndpointSettings, program: Program | None = None) -> None:
        super().__init__(context)
        self.settings = settings
        self.program = program if program is not None else load_program(settings.program)
        self.rounds: list[int] = []
        """The sizes of the last :meth:`run_batch`'s engine rounds, and the seconds spent in them."""
        self.generate_s = 0.0
        self.last_runs: list[EndpointRun] = []
        """The last :meth:`run_batch`'s runs: each program's outcome and recorded requests, beside its trajectory."""

    def endpoint(self) -> AgentEndpoint:
        """A new endpoint over this rollout's tokenizer and settings (not serving until entered)."""
        return AgentEndpoint(self.context.tokenizer, self.context.eos_ids, self.settings, self.context.chat)

    async def run(self, sample: AgentSample, llm: Any) -> Trajectory:
        """One sample, with an endpoint of its own sampling through ``llm``."""
        async with self.endpoint() as endpoint:
            return (await endpoint.run_trajectory(self.program, sample, llm)).trajectory

    async def run_batch(self, samples: Sequence[AgentSample], batch_generate: BatchGenerate, prompt_width: int) -> list[Trajectory]:
        """Every sample of a rollout call, one endpoint for all, ``max_concurrency`` programs at once; the batch's
        ``prompt_width`` lets a wider first prompt overflow into the response. Raises the engine's error, if any."""
        batcher = SessionBatcher(batch_generate, self.settings.batch_wait_s)
        slots = asyncio.Semaphore(self.settings.max_concurrency)
        context_limit = int(prompt_width) + self.settings.max_response_tokens

        async def one(order: int, sample: AgentSample) -> EndpointRun:
            async with slots:
                llm = batcher.join(order)
                try:
                    return await endpoint.run_trajectory(self.program, sample, llm, prompt_width=int(prompt_width), context_limit=context_limit)
                finally:
                    llm.leave()

        async with self.endpoint() as endpoint:
            runs = list(await asyncio.gather(*(one(order, sample) for order, sample in enumerate(samples))))
        self.rounds, self.generate_s, self.last_runs = list(batcher.rounds), batcher.seconds, runs
        if batcher.error is not None:
            raise batcher.error
        self._report(runs)
        return [run.trajectory for run in runs]

    def _report(self, runs: list[EndpointRun]) -> None:
        failed = [run.outcome for run in runs if run.outcome.failed]
        if failed:
            logger.warning("%d of %d agent programs failed (their trajectories train nothing); the first: %s",
                           len(failed), len(runs), failed[0].error)
        stuck = abandoned_threads()
        if stuck:
            logger.warning("%d agent program thread(s) still run after their timeout, blocked in a call that cannot be "
                           "cancelled; make the program's waits async or give its calls timeouts", stuck)
