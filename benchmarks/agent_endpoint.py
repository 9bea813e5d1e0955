"""The OpenAI-compatible endpoint's cost: the same two-turn trajectories through HTTP and straight to the engine.

    python benchmarks/agent_endpoint.py [--trajectories 64] [--max-new-tokens 8] [--hidden 64] [--layers 2]
                                        [--repeats 5] [--threads 1] [--cpus 0,1] [--json out.json]

Both sides roll out ``--trajectories`` short two-turn trajectories (a user prompt, an answer of up to
``--max-new-tokens`` tokens, a user turn, a second answer) on one tiny qwen2 policy with the hf engine, in this
process, with the same torch threads (``--threads``) and the same CPUs (``--cpus``, pinned for the whole run):

- **direct**: an agent loop that calls the engine itself (``llm.generate`` with token ids, the user turn spliced in
  with the chat template's wrapper), as the bundled loops do;
- **endpoint**: ``rollout.agent_server``'s loop: each trajectory is a program in a thread of its own that sends two
  ``/v1/chat/completions`` requests over HTTP to the endpoint on 127.0.0.1 (the standard-library client), whose
  tokens the endpoint records.

Each repeat runs both, alternating which goes first. Reported, medians over the repeats after a warm-up: the wall
seconds of a rollout call, the seconds inside the engine's batched calls (``G``, which both sides share: the same
rounds of the same sizes), the rest (``wall - G``), and

    overhead per request = ((endpoint wall - endpoint G) - (direct wall - direct G)) / requests
    ratio = endpoint wall / direct wall  (and with the direct side's G on both sides, as G moves between runs)

(target: ratio under 1.15). Where the time goes on the endpoint side: each request's JSON, the chat template render
of the first turn, tokenizing, decoding, HTTP over loopback, and a thread and an event loop per program.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from rlhfctl.agents.chat_turns import ChatTurns  # noqa: E402
from rlhfctl.agents.endpoint.client import EndpointClient  # noqa: E402
from rlhfctl.agents.endpoint.loop import EndpointAgentLoop  # noqa: E402
from rlhfctl.agents.endpoint.settings import endpoint_settings  # noqa: E402
from rlhfctl.agents.llm import RoundBatchedLLM  # noqa: E402
from rlhfctl.agents.loop import AgentContext, AgentLoop, AgentSample  # noqa: E402
from rlhfctl.agents.trajectory import Trajectory  # noqa: E402
from rlhfctl.models.loading import load_causal_lm, load_tokenizer  # noqa: E402
from rlhfctl.rollout.agent_rollout import hf_batch_generate, run_round_batched  # noqa: E402
from rlhfctl.rollout.generation import SamplingParams, eos_token_ids  # noqa: E402

def model_config(hidden: int, layers: int) -> dict[str, Any]:
    """The quickstart's inline qwen2 at ``hidden`` x ``layers`` (random weights, the character tokenizer)."""
    return {"config": {"model_type": "qwen2", "hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": 2,
                       "num_key_value_heads": 2, "intermediate_size": 2 * hidden, "max_position_embeddings": 512}}
TURNS = 2


class DirectTwoTurns(AgentLoop):
    """The direct side: the program's two turns written as an agent loop on token ids."""

    async def run(self, sample: AgentSample, llm: Any) -> Trajectory:
        """Answer, add the user turn, answer again."""
        trajectory = self.new_trajectory(sample)
        generation = await self.generate_turn(trajectory, llm)
        self.append_turns(trajectory, [{"role": "user", "content": "again"}], generation)
        await self.generate_turn(trajectory, llm)
        return trajectory


async def two_turns(*, base_url: str, api_key: str, model: str, sample: dict[str, Any]) -> None:
    """The endpoint side: the same two turns as an agent program over HTTP."""
    async with EndpointClient(base_url, api_key) as client:
        messages: list[dict[str, Any]] = [{"role": "user", "content": sample["question"]}]
        first = await client.chat(messages, model=model)
        messages += [first["choices"][0]["message"], {"role": "user", "content": "again"}]
        await client.chat(messages, model=model)


def setup(args: argparse.Namespace) -> dict[str, Any]:
    config = model_config(args.hidden, args.layers)
    tokenizer = load_tokenizer(config)
    model = load_causal_lm(config, tokenizer, seed=0).eval()
    eos = eos_token_ids(tokenizer, model)
    multi_turn = {"max_turns": TURNS, "max_response_tokens": 2 * args.max_new_tokens + 64}
    context = AgentContext(tokenizer=tokenizer, chat=ChatTurns(tokenizer, eos), eos_ids=eos, settings=multi_turn,
                           max_new_tokens=args.max_new_tokens)
    settings = endpoint_settings({"program": "benchmarks.agent_endpoint:two_turns", "max_concurrency": args.trajectories,
                                  "batch_wait_s": 1.0}, multi_turn, args.max_new_tokens)
    questions = [f"digits {i % 10} {(3 * i) % 10} {(7 * i) % 10}:" for i in range(args.trajectories)]
    # Both sides start from the same prompt tokens: the chat-rendered question.
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
               for q in questions]
    samples = [AgentSample(list(tokenizer.encode(p, add_special_tokens=False)), {"question": q}, str(i))
               for i, (p, q) in enumerate(zip(prompts, questions))]
    return {"tokenizer": tokenizer, "model": model, "eos": eos, "context": context, "settings": settings, "samples": samples}


def engine(state: dict[str, Any], seed: int, max_new_tokens: int) -> Any:
    params = SamplingParams(n=1, max_new_tokens=max_new_tokens)
    return hf_batch_generate(state["model"], params, eos_ids=state["eos"], pad_id=int(state["tokenizer"].pad_token_id),
                             device=torch.device("cpu"), generator=torch.Generator().manual_seed(seed))


def direct(state: dict[str, Any], seed: int, max_new_tokens: int) -> dict[str, Any]:
    loop, samples = DirectTwoTurns(state["context"]), state["samples"]
    llm = RoundBatchedLLM(engine(state, seed, max_new_tokens), live=len(samples))

    start = time.perf_counter()
    trajectories = asyncio.run(run_round_batched(loop, samples, llm))
    return _result(time.perf_counter() - start, llm.seconds, llm.rounds, trajectories)


def endpoint(state: dict[str, Any], seed: int, max_new_tokens: int) -> dict[str, Any]:
    loop = EndpointAgentLoop(state["context"], replace(state["settings"], max_new_tokens=max_new_tokens), two_turns)
    start = time.perf_counter()
    trajectories = asyncio.run(loop.run_batch(state["samples"], engine(state, seed, max_new_tokens), 64))
    result = _result(time.perf_counter() - start, loop.generate_s, loop.rounds, trajectories)
    result["divergent"] = sum(t.tool_metrics["endpoint/divergent_requests"][0] for t in trajectories)
    result["errors"] = [t.reward_extra["endpoint_error"] for t in trajectories if t.reward_extra["endpoint_error"]][:3]
    return result


def _result(wall: float, generate: float, rounds: list[int], trajectories: list[Trajectory]) -> dict[str, Any]:
    return {"wall_s": wall, "generate_s": generate, "rest_s": wall - generate, "rounds": list(rounds),
            "policy_tokens": sum(sum(t.response_mask) for t in trajectories)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trajectories", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=64, help="the policy's hidden size (64: the quickstart's)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads, both sides")
    parser.add_argument("--cpus", type=str, default=None, help="pin the process to these CPUs, e.g. 0,1")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.cpus:
        os.sched_setaffinity(0, {int(cpu) for cpu in args.cpus.split(",")})
    torch.set_num_threads(args.threads)
    state = setup(args)
    direct(state, 100, args.max_new_tokens), endpoint(state, 100, args.max_new_tokens)  # warm-up
    runs: dict[str, list[dict[str, Any]]] = {"direct": [], "endpoint": []}
    for repeat in range(args.repeats):
        order = ("direct", "endpoint") if repeat % 2 == 0 else ("endpoint", "direct")
        for side in order:
            runs[side].append((direct if side == "direct" else endpoint)(state, repeat, args.max_new_tokens))
    requests = args.trajectories * TURNS
    summary: dict[str, Any] = {"trajectories": args.trajectories, "requests": requests, "threads": args.threads,
                               "cpus": sorted(os.sched_getaffinity(0)), "max_new_tokens": args.max_new_tokens,
                               "hidden": args.hidden, "layers": args.layers}
    for side, results in runs.items():
        summary[side] = {key: statistics.median(r[key] for r in results) for key in ("wall_s", "generate_s", "rest_s")}
        summary[side]["rounds"] = results[-1]["rounds"]
        summary[side]["policy_tokens"] = results[-1]["policy_tokens"]
    summary["endpoint"]["divergent"] = runs["endpoint"][-1]["divergent"]
    summary["endpoint"]["errors"] = runs["endpoint"][-1]["errors"]
    extra = summary["endpoint"]["rest_s"] - summary["direct"]["rest_s"]
    summary["overhead_ms_per_request"] = 1000 * extra / requests
    summary["ratio"] = summary["endpoint"]["wall_s"] / summary["direct"]["wall_s"]
    # the engine's own seconds move between runs on a shared machine: the ratio with the direct side's engine time on both
    summary["ratio_same_engine"] = (summary["direct"]["generate_s"] + summary["endpoint"]["rest_s"]) / summary["direct"]["wall_s"]
    summary["samples"] = runs
    print(f"{args.trajectories} two-turn trajectories ({requests} requests, up to {args.max_new_tokens} new tokens each), "
          f"qwen2 {args.hidden} x {args.layers}, torch threads {args.threads}, CPUs {summary['cpus']}, medians of {args.repeats}")
    for side in ("direct", "endpoint"):
        s = summary[side]
        print(f"  {side:9s} wall {s['wall_s']:.3f} s = engine {s['generate_s']:.3f} s + rest {s['rest_s']:.3f} s; "
              f"rounds {s['rounds']}")
    print(f"endpoint / direct wall = {summary['ratio']:.3f} ({summary['ratio_same_engine']:.3f} with the same engine seconds); "
          f"endpoint overhead {summary['overhead_ms_per_request']:.2f} ms per request "
          f"({summary['endpoint']['divergent']:.0f} divergent requests, errors {summary['endpoint']['errors']})")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main()
