"""One trajectory's requests as served, and the trajectory they make: from the recorded tokens, never re-tokenized.

Every request the program sends under its session is recorded: the prompt token ids the engine read, the token ids
it sampled and their log-probs (:class:`RequestRecord`). The trajectory is the **first consistent chain**:

- the first request's prompt is the trajectory's prompt;
- a request whose prompt starts with the chain so far (the previous prompt and the tokens sampled for it) extends
  it: the tokens after the chain are context the policy did not write (user and tool turns the program added, the
  chat template's wrapper around them: loss mask 0), the sampled tokens are the policy's (mask 1, with their
  log-probs);
- a request whose prompt does not (the program rewrote or dropped earlier turns, or branched) is served but not
  trained on: it counts in ``endpoint/divergent_requests``, and the chain goes on from where it was.

Budgets are those of every agent trajectory (``rollout.multi_turn``): ``max_turns`` sampling requests, and
``max_response_tokens`` tokens after the prompt. A first prompt wider than the rollout batch's prompt columns
carries its overflow into the response (mask 0), so the overflow counts against ``max_response_tokens``. A request
past a budget samples nothing and is answered with ``finish_reason: "length"``; the trajectory is marked truncated.
A request whose prompt alone does not fit the engine's context is refused (HTTP 400).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from rlhfctl.agents.trajectory import Trajectory

__all__ = ["Admission", "RequestRecord", "Session"]


@dataclass(frozen=True)
class RequestRecord:
    """One served request: what the engine read and sampled, and whether the trajectory took it."""

    endpoint: str
    """``chat`` or ``completions``."""
    prompt_ids: list[int]
    token_ids: list[int]
    log_probs: list[float]
    in_trajectory: bool
    finish_reason: str


@dataclass(frozen=True)
class Admission:
    """Where a request's prompt stands against the chain: ``first``, ``extends``, ``diverges``, ``spent`` (a budget
    is used up: nothing is sampled) or ``too_long`` (the prompt alone does not fit the context)."""

    kind: str
    max_tokens: int = 0
    new_context: list[int] = field(default_factory=list)
    chain_length: int = 0
    """The chain's length when admitted: a concurrent request of the same session that grew it since makes this one
    diverge."""


class Session:
    """One trajectory's endpoint state: the recorded requests, the chain, what splices the next turn onto it."""

    def __init__(
        self,
        session_id: str,
        *,
        fallback_prompt_ids: list[int],
        max_response_tokens: int,
        max_turns: int,
        prompt_width: int | None = None,
        context_limit: int | None = None,
    ) -> None:
        self.session_id = session_id
        self.fallback_prompt_ids = list(fallback_prompt_ids)
        self.max_response_tokens, self.max_turns = int(max_response_tokens), int(max_turns)
        self.prompt_width, self.context_limit = prompt_width, context_limit
        self.trajectory: Trajectory | None = None
        self.records: list[RequestRecord] = []
        self.counts: Counter[str] = Counter()
        """requests, divergent_requests, request_timeouts, rejected_requests, tool_calls, malformed_tool_calls."""
        self.chain_messages: list[dict[str, Any]] | None = None
        """The chat messages the chain's tokens hold: the last request's, then the assistant message returned."""
        self.chain_text: str | None = None
        """The text the chain's tokens hold for ``/v1/completions``: the last prompt, then the text returned."""
        self.last_token: int | None = None
        """The chain's last sampled token when its turn ended on EOS (None when it ran out of tokens)."""
        self.closed = False

    # ------------------------------------------------------------------ admission
    def admit(self, prompt_ids: list[int]) -> Admission:
        """Where ``prompt_ids`` stands against the chain, and how many tokens it may sample (the budgets)."""
        sampled = sum(1 for record in self.records if record.token_ids)
        room = self.context_limit - len(prompt_ids) if self.context_limit is not None else 1 << 30
        if self.trajectory is None:
            budget = min(self.max_response_tokens - self._overflow(prompt_ids), room)
            if budget < 1:
                return Admission("too_long")
            if sampled >= self.max_turns:
                return Admission("spent")
            return Admission("first", max_tokens=budget)
        context = self.trajectory.context_ids
        if sampled >= self.max_turns:
            return Admission("spent", chain_length=len(context))
        if prompt_ids[: len(context)] == context:
            new = list(prompt_ids[len(context):])
            left = self.trajectory.budget_left - len(new)
            if left < 1:
                return Admission("spent", chain_length=len(context))
            return Admission("extends", max_tokens=left, new_context=new, chain_length=len(context))
        if room < 1:
            return Admission("too_long")
        return Admission("diverges", max_tokens=room, chain_length=len(context))

    # ------------------------------------------------------------------ recording
    def record(
        self,
        endpoint: str,
        admission: Admission,
        prompt_ids: list[int],
        token_ids: list[int],
        log_probs: list[float],
        *,
        finished: bool,
        finish_reason: str,
        chain_messages: list[dict[str, Any]] | None = None,
        chain_text: str | None = None,
    ) -> bool:
        """Record one served request; merge it into the chain when it starts or extends it (True then)."""
        if self.closed:
            return False
        self.counts["requests"] += 1
        kind = admission.kind
        if kind == "spent" and self.trajectory is not None:
            self.trajectory.truncated = True
        current = len(self.trajectory.context_ids) if self.trajectory is not None else 0
        if kind in ("first", "extends") and current != admission.chain_length:
            kind = "diverges"  # a concurrent request of this session started or grew the chain meanwhile
        merged = kind in ("first", "extends") and bool(token_ids)
        if kind == "diverges":
            self.counts["divergent_requests"] += 1
        if merged:
            if self.trajectory is None:
                self.trajectory = Trajectory(prompt_ids=list(prompt_ids), budget=self.max_response_tokens - self._overflow(prompt_ids))
            elif not self.trajectory.append_context(admission.new_context):
                raise RuntimeError("an admitted context did not fit the trajectory's budget")  # admit() leaves room
            self.trajectory.append_generated(token_ids, log_probs)
            self.trajectory.num_turns += 1
            self.chain_messages, self.chain_text = chain_messages, chain_text
            self.last_token = int(token_ids[-1]) if finished else None
        self.records.append(RequestRecord(endpoint, list(prompt_ids), list(token_ids), list(log_probs), merged, finish_reason))
        return merged

    def _overflow(self, prompt_ids: list[int]) -> int:
        return max(0, len(prompt_ids) - self.prompt_width) if self.prompt_width is not None else 0

    # ------------------------------------------------------------------ the result
    def finish(self, *, reward: float | None, error: str | None, timed_out: bool, seconds: float) -> Trajectory:
        """The trajectory: the chain (or the dataset prompt with an empty response when nothing was sampled), or, for
        a failed program, the dataset prompt with an empty response; ``reward_extra`` and the endpoint metrics set."""
        self.closed = True
        failed = error is not None
        chain = self.trajectory
        if failed or chain is None:
            trajectory = Trajectory(prompt_ids=list(self.fallback_prompt_ids), budget=self.max_response_tokens)
        else:
            trajectory = chain
            last = next(record for record in reversed(self.records) if record.in_trajectory)
            trajectory.truncated = trajectory.truncated or last.finish_reason == "length"
        trajectory.messages = list(self._conversation())
        trajectory.tool_calls = self.counts["tool_calls"]
        trajectory.tool_errors = self.counts["malformed_tool_calls"]
        trajectory.reward_extra.update({
            "tool_rewards": float(reward) if reward is not None and not failed else 0.0,
            "program_reward": None if failed else reward,
            "endpoint_error": error,
        })
        metrics = {
            "requests": self.counts["requests"],
            "divergent_requests": self.counts["divergent_requests"],
            "rejected_requests": self.counts["rejected_requests"],
            "request_timeouts": self.counts["request_timeouts"],
            "errors": int(failed and not timed_out),
            "timeouts": int(timed_out),
            "program_s": seconds,
        }
        trajectory.tool_metrics.update({f"endpoint/{key}": [float(value)] for key, value in metrics.items()})
        return trajectory

    def _conversation(self) -> list[dict[str, Any]]:
        if self.chain_messages is not None:
            return [dict(message) for message in self.chain_messages]
        if self.chain_text is not None:
            return [{"role": "completion", "content": self.chain_text}]
        return []
