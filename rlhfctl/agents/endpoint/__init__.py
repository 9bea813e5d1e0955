"""Any agent program as the rollout: an OpenAI-compatible endpoint per rollout rank (``rollout.agent_server``).

With ``rollout.agent_server.program`` set (and ``rollout.multi_turn.enable``), each sample of a rollout call is one
run of the program::

    async def program(*, base_url: str, api_key: str, model: str, sample: dict) -> float | None

against ``base_url``, an OpenAI-compatible ``/v1`` served on 127.0.0.1 by the rank itself (``/chat/completions``,
``/completions``, ``/models``), backed by the rank's engine (hf or vLLM) through the same batched rounds as the
other agent loops. The server records the tokens of every request; the trajectory is built from those recorded
tokens, never from re-tokenized text: the policy's sampled tokens have loss mask 1, the turns the program added
mask 0. The program returns a float reward, or None to let the recipe's reward function score the trajectory.

The pieces, for building on (a ``verifiers`` environment, say):

- :class:`AgentEndpoint` (``server``): the HTTP endpoint; :meth:`AgentEndpoint.run_trajectory` runs one program
  for one :class:`~rlhfctl.agents.loop.AgentSample` on any :class:`~rlhfctl.agents.llm.LLM` and returns an
  :class:`EndpointRun` (the :class:`~rlhfctl.agents.trajectory.Trajectory`, the :class:`ProgramOutcome`, every
  :class:`RequestRecord`)::

      async with AgentEndpoint(tokenizer, eos_ids, settings) as endpoint:
          run = await endpoint.run_trajectory(program, sample, llm)

- :class:`Session` (``session``): one trajectory's requests and the chain rule that makes them a trajectory;
- :func:`load_program` / :func:`run_program` (``program``): import a program, run it in a thread of its own with a
  timeout;
- :class:`EndpointAgentLoop` (``loop``): all of it as an agent loop, what the rollout runs;
- :class:`EndpointClient` (``client``): a standard-library client for programs without ``openai``;
- :func:`~rlhfctl.agents.endpoint.program_reward.program_reward`: the programs' floats as a reward function.
"""

from __future__ import annotations

from rlhfctl.lazy_exports import lazy_exports

__all__ = [
    "AgentEndpoint",
    "EndpointAgentLoop",
    "EndpointClient",
    "EndpointHTTPError",
    "EndpointRun",
    "EndpointSettings",
    "ProgramOutcome",
    "RequestRecord",
    "Session",
    "SessionBatcher",
    "endpoint_settings",
    "load_program",
    "run_program",
]

__getattr__ = lazy_exports(
    __name__,
    {
        "AgentEndpoint": "rlhfctl.agents.endpoint.server",
        "EndpointRun": "rlhfctl.agents.endpoint.server",
        "EndpointAgentLoop": "rlhfctl.agents.endpoint.loop",
        "EndpointClient": "rlhfctl.agents.endpoint.client",
        "EndpointHTTPError": "rlhfctl.agents.endpoint.client",
        "EndpointSettings": "rlhfctl.agents.endpoint.settings",
        "endpoint_settings": "rlhfctl.agents.endpoint.settings",
        "ProgramOutcome": "rlhfctl.agents.endpoint.program",
        "load_program": "rlhfctl.agents.endpoint.program",
        "run_program": "rlhfctl.agents.endpoint.program",
        "RequestRecord": "rlhfctl.agents.endpoint.session",
        "Session": "rlhfctl.agents.endpoint.session",
        "SessionBatcher": "rlhfctl.agents.endpoint.batcher",
    },
)
