"""Agent rollouts: do the tool waits of a step's trajectories overlap?

    python benchmarks/agent_rollout.py [--prompts 16] [--n 4] [--tool-turns 3] [--sleep-s 0.1] [--rounds 3] [--json out.json]

One actor rank in this process (the quickstart's tiny qwen2, hf engine) rolls out prompts x n trajectories
(64 by default). Every assistant turn calls a tool that sleeps ``--sleep-s`` (100 ms) until ``--tool-turns``
calls are made (``max_turns`` = tool turns + 1), so a step makes 64 x 3 = 192 calls: 19.2 s of waiting one
after another. Reported, medians over the rounds after a warm-up: the rollout's seconds, the seconds inside
the engine's batched generate calls (``G``), the rounds and their sizes, and

    overlap ratio = (rollout - G) / (tool turns x sleep)

which is about 1 when each turn's tool calls wait together (the rollout costs generation plus one tool
latency per turn) and would be about prompts x n (64) if they waited one after another; it also counts
the loop's own Python work (templates, decoding, parsing), which the **wait ratio** leaves out: the same
rollout with an instant tool is subtracted instead of ``G``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from rlhfctl.agents import Tool, ToolResult  # noqa: E402
from rlhfctl.agents.tool_calls import ParsedTurn, ToolCall, register_tool_call_parser  # noqa: E402


class SleepTool(Tool):
    """Waits ``config['sleep_s']`` seconds (an API call, a sandbox), then answers ``slept``."""

    name = "sleep"
    schema = {"type": "function", "function": {"name": "sleep", "parameters": {"type": "object", "properties": {}}}}

    async def execute(self, instance_id: str, arguments: Any) -> ToolResult:
        await asyncio.sleep(float(self.config.get("sleep_s", 0.1)))
        return ToolResult(text="slept")


@register_tool_call_parser("benchmark_always_sleep")
def always_sleep(text: str) -> ParsedTurn:
    """Every turn calls the tool (a random policy writes no calls itself)."""
    return ParsedTurn(text, [ToolCall("sleep", {})])


def actor(prompts: int, n: int, tool_turns: int, sleep_s: float) -> Any:
    from rlhfctl.single_controller import ClassWithInitArgs, LocalWorkerGroup
    from tests.workers.recipes import tiny_recipe
    from workers import ActorWorker

    model = {"config": {"model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                        "num_key_value_heads": 2, "intermediate_size": 128, "max_position_embeddings": 256}}
    multi_turn = {"enable": True, "max_turns": tool_turns + 1, "max_response_tokens": 160, "max_tool_response_tokens": 16,
                  "tool_timeout_s": 10.0, "format": "benchmark_always_sleep",
                  "tools": [{"class": "benchmarks.agent_rollout:SleepTool", "config": {"sleep_s": sleep_s}}]}
    recipe = tiny_recipe(rollout={"n": n, "max_new_tokens": 8, "multi_turn": multi_turn},
                         data={"max_prompt_length": 32}, roles={"actor": {"model": model}})
    group = LocalWorkerGroup(1, ClassWithInitArgs(ActorWorker, recipe, "actor"), role="actor")
    group.init_model()
    return group


def one_round(group: Any, prompts: int, seed: int, sleep_s: float) -> dict[str, Any]:
    from tests.workers.recipes import digits_prompts

    worker = group.workers[0]
    worker.agent_rollout.tools["sleep"].config["sleep_s"] = sleep_s
    start = time.perf_counter()
    rollout = group.generate_sequences(digits_prompts(prompts, seed=seed))
    seconds = time.perf_counter() - start
    return {"rollout_s": seconds, "generate_s": worker.agent_rollout.last_generate_s, "rounds": list(worker.agent_rollout.last_rounds),
            "tool_calls": int(rollout.non_tensor_batch["agent/tool_calls"].sum())}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--tool-turns", type=int, default=3)
    parser.add_argument("--sleep-s", type=float, default=0.1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    group = actor(args.prompts, args.n, args.tool_turns, args.sleep_s)
    try:
        one_round(group, args.prompts, seed=100, sleep_s=args.sleep_s)  # warm-up
        results, instant = [], []
        for seed in range(args.rounds):  # the same prompts with the sleeping tool and with an instant one
            results.append(one_round(group, args.prompts, seed=seed, sleep_s=args.sleep_s))
            instant.append(one_round(group, args.prompts, seed=seed, sleep_s=0.0))
    finally:
        group.shutdown()
    rollout = statistics.median(r["rollout_s"] for r in results)
    generate = statistics.median(r["generate_s"] for r in results)
    baseline = statistics.median(r["rollout_s"] for r in instant)
    trajectories = args.prompts * args.n
    waiting = args.tool_turns * args.sleep_s
    summary = {
        "trajectories": trajectories, "tool_turns": args.tool_turns, "sleep_s": args.sleep_s,
        "tool_calls": results[-1]["tool_calls"], "rounds": results[-1]["rounds"],
        "rollout_s": rollout, "generate_s": generate, "instant_tool_rollout_s": baseline,
        "overlap_ratio": (rollout - generate) / waiting, "wait_ratio": (rollout - baseline) / waiting,
        "serial_estimate_s": generate + results[-1]["tool_calls"] * args.sleep_s,
    }
    print(f"{trajectories} trajectories x {args.tool_turns} tool turns, tool sleeps {args.sleep_s * 1000:.0f} ms, "
          f"{summary['tool_calls']} calls; rounds of {summary['rounds']}")
    print(f"rollout {rollout:.2f} s = generate {generate:.2f} s + {rollout - generate:.2f} s besides "
          f"(tool waits one after another: {summary['serial_estimate_s']:.1f} s); with an instant tool {baseline:.2f} s")
    print(f"overlap ratio (rollout - generate) / (tool turns x sleep) = {summary['overlap_ratio']:.2f}; "
          f"wait ratio (rollout - instant-tool rollout) / (tool turns x sleep) = {summary['wait_ratio']:.2f} "
          f"(1 = each turn's calls wait together; {trajectories} = one after another)")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main()
