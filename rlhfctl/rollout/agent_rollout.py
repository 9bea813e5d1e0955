"""Agent rollouts (``rollout.multi_turn.enable``): every trajectory of the rank's shard in flight at once.

Each of the ``B * n`` samples runs its agent loop (``rlhfctl/agents/loop.py``) as a coroutine of one
event loop; their generate calls meet in a :class:`~rlhfctl.agents.llm.RoundBatchedLLM`, so each round's
live trajectories go to the engine together: on ``hf`` left-padded into one decoding loop
(:func:`hf_batch_generate`), on ``vllm`` as one list of token prompts that the engine schedules
(``VllmRolloutEngine.generate_token_lists``). Tool calls run concurrently between the rounds.

The result has the layout of :func:`rlhfctl.rollout.generation.rollout_batch` with the response
right-padded to ``max_response_tokens``: ``response_mask`` is the loss mask (the policy's tokens), the
attention mask covers every real token (tool outputs included), ``rollout_log_probs`` the engine's
log-probs (0 at mask 0). Non-tensor columns added: ``messages`` (the whole conversation, the prompt's
messages first), ``tool_rewards``, ``num_turns``, ``reward_extra`` (the loop's dict per sample) and
the per-sample metric columns ``agent/tool_calls``, ``agent/tool_errors``, ``agent/tool_latency_s``,
``agent/truncated`` and ``agent/tool_metrics`` (a dict per sample: ``<tool>/<key>``, a tool's own
metrics averaged over its calls).

A trajectory's prompt is normally its sample's; a loop may give it a prompt of its own (the endpoint loop: the
program's first request). Such a prompt is laid out in the batch's prompt columns, left-padded, its overflow past
their width carried at the start of the response (mask 0); its ``messages`` (and every endpoint trajectory's) are
then the whole conversation, with no dataset messages before them.

With ``rollout.agent_server.program`` the loop is :class:`~rlhfctl.agents.endpoint.EndpointAgentLoop`: each sample
is one run of an agent program against an OpenAI-compatible endpoint on this rank (``rlhfctl/agents/endpoint/``).
A loop that needs the whole call at once defines ``run_batch(samples, batch_generate, prompt_width)``, which the
rollout calls instead of running ``run`` per sample.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch import nn

from rlhfctl.agents.chat_turns import ChatTurns
from rlhfctl.agents.endpoint.loop import EndpointAgentLoop
from rlhfctl.agents.endpoint.program import load_program
from rlhfctl.agents.endpoint.settings import endpoint_settings
from rlhfctl.agents.llm import BatchGenerate, Generation, GenerationRequest, RoundBatchedLLM
from rlhfctl.agents.loop import AgentContext, AgentSample
from rlhfctl.agents.tool_registry import agent_loop_class, build_tools, environment_spec
from rlhfctl.agents.trajectory import Trajectory
from rlhfctl.protocol import DataProto
from rlhfctl.recipe.schema import MultiTurnConfig, defaults_of, nullable_keys
from rlhfctl.rollout.generation import SamplingParams, eos_token_ids, rollout_batch, sample_responses

__all__ = ["AgentRollout", "agent_rollout_enabled", "agent_rollout_for", "hf_batch_generate", "multi_turn_settings", "run_coroutine",
           "run_round_batched"]

METRIC_PREFIX = "agent/"
"""Per-sample metric columns; ``workers.reward.is_internal_column`` keeps them from reward functions."""


def hf_batch_generate(
    model: nn.Module,
    params: SamplingParams,
    *,
    eos_ids: list[int],
    pad_id: int,
    device: torch.device,
    generator: torch.Generator | None,
) -> BatchGenerate:
    """One round on the actor's own sampler: the requests left-padded into one batch, each cut to its own
    ``max_tokens`` (the round decodes to the largest)."""
    eos = set(eos_ids)

    def generate(requests: list[GenerationRequest]) -> list[Generation]:
        width = max(len(request.token_ids) for request in requests)
        ids = torch.full((len(requests), width), int(pad_id), dtype=torch.long)
        mask = torch.zeros((len(requests), width), dtype=torch.long)
        for row, request in enumerate(requests):
            ids[row, width - len(request.token_ids):] = torch.tensor(request.token_ids, dtype=torch.long)
            mask[row, width - len(request.token_ids):] = 1
        round_params = replace(params, n=1, max_new_tokens=max(request.max_tokens for request in requests))
        tokens, valid, log_probs = sample_responses(
            model, ids.to(device), mask.to(device), round_params, eos_ids=eos_ids, pad_id=int(pad_id),
            generator=generator, samples_per_prompt=1, with_log_probs=True,
        )
        results = []
        for row, request in enumerate(requests):
            length = min(int(valid[row].sum()), request.max_tokens)
            kept = tokens[row, :length].tolist()
            results.append(Generation(kept, log_probs[row, :length].tolist(), finished=bool(kept) and kept[-1] in eos))
        return results

    return generate


def run_coroutine(coroutine: Any) -> Any:
    """Run ``coroutine`` to the end: in this thread, or in a helper thread when this one already runs an event
    loop (the local backend inside an async caller)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(coroutine)
        except BaseException as error:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = error

    thread = threading.Thread(target=target, name="agent-rollout")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def multi_turn_settings(rollout: Mapping[str, Any]) -> dict[str, Any]:
    """``rollout.multi_turn`` with its schema defaults."""
    defaults, nullable = defaults_of(MultiTurnConfig), nullable_keys(MultiTurnConfig)
    given = dict(rollout.get("multi_turn") or {})
    return {**defaults, **{key: value for key, value in given.items() if value is not None or key in nullable}}


def agent_rollout_enabled(rollout: Mapping[str, Any]) -> bool:
    """Whether ``rollout.multi_turn.enable`` is on."""
    return bool((rollout.get("multi_turn") or {}).get("enable"))


def agent_rollout_for(rollout: Mapping[str, Any], tokenizer: Any, model: nn.Module) -> AgentRollout | None:
    """The rank's agent rollout with ``rollout.multi_turn.enable`` (None without): the model's EOS ids, the tokenizer's pad."""
    if not agent_rollout_enabled(rollout):
        return None
    eos_ids = eos_token_ids(tokenizer, model)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]
    return AgentRollout(rollout, tokenizer, eos_ids, int(pad_id))


class AgentRollout:
    """The agent side of one actor rank: the tools (built once), the loop class, the chat turns."""

    def __init__(self, rollout: Mapping[str, Any], tokenizer: Any, eos_ids: list[int], pad_id: int) -> None:
        self.settings = multi_turn_settings(rollout)
        self.max_new_tokens = int(rollout["max_new_tokens"])
        self.tokenizer, self.eos_ids, self.pad_id = tokenizer, list(eos_ids), int(pad_id)
        self.endpoint = endpoint_settings(rollout.get("agent_server"), self.settings, self.max_new_tokens)
        """``rollout.agent_server`` when it names a program (None: the tool or environment loop)."""
        self.program = load_program(self.endpoint.program) if self.endpoint is not None else None
        # an endpoint program may use /v1/completions only, with a tokenizer that has no chat template
        no_template = self.endpoint is not None and not getattr(tokenizer, "chat_template", None)
        self.chat = None if no_template else ChatTurns(tokenizer, eos_ids)
        self.tools = build_tools(self.settings)
        self.environment = environment_spec(self.settings)
        self.loop_class = agent_loop_class(self.settings)
        self.spans: list[tuple[str, float, float]] = []
        self.last_rounds: list[int] = []
        """The sizes of the last rollout's engine rounds, and the seconds spent in them (benchmarks/agent_rollout.py)."""
        self.last_generate_s = 0.0

    def take_spans(self) -> list[tuple[str, float, float]]:
        """The rounds' and tool calls' spans since the last call (for the dispatch trace), then forgotten."""
        spans, self.spans = self.spans, []
        return spans

    def generate(self, prompts: DataProto, params: SamplingParams, batch_generate: BatchGenerate) -> DataProto:
        """``params.n`` trajectories per prompt row, in the rollout batch layout (see the module docstring)."""
        samples = self._samples(prompts, params.n)
        context = AgentContext(
            tokenizer=self.tokenizer, chat=self.chat, eos_ids=self.eos_ids, settings=self.settings,
            max_new_tokens=min(self.max_new_tokens, int(params.max_new_tokens)), tools=self.tools,
            environment=self.environment,
        )
        loop = self._loop(context, min(self.max_new_tokens, int(params.max_new_tokens)))
        if hasattr(loop, "run_batch"):  # the whole call at once (the endpoint loop: one server for every sample)
            width = int(prompts.batch["input_ids"].shape[1])
            trajectories = run_coroutine(loop.run_batch(samples, self._traced(batch_generate), width))
            self.last_rounds, self.last_generate_s = list(loop.rounds), loop.generate_s
        else:
            llm = RoundBatchedLLM(self._traced(batch_generate), live=len(samples))
            trajectories = run_coroutine(run_round_batched(loop, samples, llm))
            self.last_rounds, self.last_generate_s = list(llm.rounds), llm.seconds
        for trajectory in trajectories:
            self.spans.extend(trajectory.spans)
        return self._batch(prompts, params, samples, trajectories)

    def _loop(self, context: AgentContext, max_new_tokens: int) -> Any:
        """The call's loop: the endpoint loop with ``rollout.agent_server.program``, else the configured loop class."""
        if self.endpoint is None:
            return self.loop_class(context)
        return EndpointAgentLoop(context, replace(self.endpoint, max_new_tokens=max_new_tokens), self.program)

    def _traced(self, batch_generate: BatchGenerate) -> Callable[[list[GenerationRequest]], list[Generation]]:
        def generate(requests: list[GenerationRequest]) -> list[Generation]:
            start = time.time()
            try:
                return batch_generate(requests)
            finally:
                self.spans.append(("agent.generate", start, time.time()))

        return generate

    def _samples(self, prompts: DataProto, n: int) -> list[AgentSample]:
        ids, mask = prompts.batch["input_ids"], prompts.batch["attention_mask"]
        columns = {key: values for key, values in prompts.non_tensor_batch.items() if key != "uid"}
        uids = prompts.non_tensor_batch.get("uid")
        samples = []
        for row in range(len(prompts)):
            prompt_ids = ids[row][mask[row].bool()].tolist()
            row_columns = {key: values[row] for key, values in columns.items()}
            base = str(uids[row]) if uids is not None else str(row)
            samples += [AgentSample(prompt_ids, row_columns, f"{base}-{index}") for index in range(n)]
        return samples

    def _batch(self, prompts: DataProto, params: SamplingParams, samples: list[AgentSample], trajectories: list[Trajectory]) -> DataProto:
        width = int(self.settings["max_response_tokens"])
        rows = len(trajectories)
        per_sample, overflow = self._prompt_rows(prompts, params.n, samples, trajectories)
        responses = torch.full((rows, width), self.pad_id, dtype=prompts.batch["input_ids"].dtype)
        loss_mask = torch.zeros((rows, width), dtype=prompts.batch["attention_mask"].dtype)
        real = torch.zeros_like(loss_mask)
        log_probs = torch.zeros((rows, width), dtype=torch.float32)
        for row, trajectory in enumerate(trajectories):
            head = overflow[row]  # a loop's own prompt past the prompt columns: context, mask 0
            ids = (head + trajectory.response_ids)[:width]
            mask = ([0] * len(head) + trajectory.response_mask)[:width]
            scores = ([0.0] * len(head) + trajectory.rollout_log_probs)[:width]
            length = len(ids)
            responses[row, :length] = torch.tensor(ids, dtype=responses.dtype)
            loss_mask[row, :length] = torch.tensor(mask, dtype=loss_mask.dtype)
            real[row, :length] = 1
            log_probs[row, :length] = torch.tensor(scores, dtype=torch.float32)
        batch = rollout_batch(
            per_sample, responses, loss_mask, self.tokenizer, replace(params, n=1, max_new_tokens=width),
            {"rollout_log_probs": log_probs}, response_attention_mask=real,
        )
        batch.non_tensor_batch.update(self._columns(batch, samples, trajectories))
        return batch

    def _prompt_rows(self, prompts: DataProto, n: int, samples: list[AgentSample],
                     trajectories: list[Trajectory]) -> tuple[DataProto, list[list[int]]]:
        """The prompt rows, one per trajectory (``n`` per prompt, consecutive): the sample's own, or the trajectory's
        own prompt left-padded to the same width, whose overflow (returned per row) starts the response."""
        rows = prompts.repeat(n, interleave=True) if n > 1 else prompts
        ids, mask = rows.batch["input_ids"].clone(), rows.batch["attention_mask"].clone()
        width = int(ids.shape[1])
        overflow: list[list[int]] = []
        for row, (sample, trajectory) in enumerate(zip(samples, trajectories)):
            own = list(trajectory.prompt_ids)
            if own == list(sample.prompt_ids):
                overflow.append([])
                continue
            head, tail = own[:width], own[width:]
            ids[row], mask[row] = self.pad_id, 0
            if head:
                ids[row, width - len(head):] = torch.tensor(head, dtype=ids.dtype)
                mask[row, width - len(head):] = 1
            overflow.append(tail)
        tensors = {**dict(rows.batch), "input_ids": ids, "attention_mask": mask}
        tensors.pop("position_ids", None)  # recomputed over prompt + response
        return DataProto(batch=tensors, non_tensor_batch=dict(rows.non_tensor_batch), meta_info=dict(rows.meta_info)), overflow

    def _columns(self, batch: DataProto, samples: list[AgentSample], trajectories: list[Trajectory]) -> dict[str, np.ndarray]:
        def objects(values: list[Any]) -> np.ndarray:
            array = np.empty(len(values), dtype=object)
            array[:] = values
            return array

        prompt_messages = batch.non_tensor_batch.get("prompt_messages")
        prompt_texts = batch.non_tensor_batch.get("prompt_text")
        conversations = []
        for row, (sample, trajectory) in enumerate(zip(samples, trajectories)):
            if self.endpoint is not None or list(trajectory.prompt_ids) != list(sample.prompt_ids):
                conversations.append(list(trajectory.messages))  # its own prompt: messages are the whole conversation
                continue
            head = list(prompt_messages[row]) if prompt_messages is not None and prompt_messages[row] is not None else (
                [{"role": "user", "content": str(prompt_texts[row])}] if prompt_texts is not None else [])
            conversations.append(head + list(trajectory.messages))
        columns = {
            "messages": objects(conversations),
            "tool_rewards": np.array([t.tool_rewards for t in trajectories], dtype=np.float64),
            "num_turns": np.array([t.num_turns for t in trajectories], dtype=np.int64),
            "reward_extra": objects([dict(t.reward_extra) for t in trajectories]),
            f"{METRIC_PREFIX}tool_calls": np.array([t.tool_calls for t in trajectories], dtype=np.float64),
            f"{METRIC_PREFIX}tool_errors": np.array([t.tool_errors for t in trajectories], dtype=np.float64),
            f"{METRIC_PREFIX}tool_latency_s": np.array([t.tool_latency_s for t in trajectories], dtype=np.float64),
            f"{METRIC_PREFIX}truncated": np.array([float(t.truncated) for t in trajectories], dtype=np.float64),
        }
        # One column of dicts, so every rank's batch has the same columns whichever tools its samples called.
        columns[f"{METRIC_PREFIX}tool_metrics"] = objects(
            [{key: float(np.mean(values)) for key, values in t.tool_metrics.items() if values} for t in trajectories]
        )
        return columns


async def run_round_batched(loop: Any, samples: list[AgentSample], llm: RoundBatchedLLM) -> list[Trajectory]:
    """Every sample's trajectory at once, each on its own handle of the round-batched engine (the rollout and the
    endpoint benchmark's direct side)."""
    async def one(order: int, sample: AgentSample) -> Trajectory:
        handle = llm.bind(order)
        try:
            return await loop.run(sample, handle)
        finally:
            handle.leave()

    return list(await asyncio.gather(*(one(order, sample) for order, sample in enumerate(samples))))
