"""A bf16 rollout with its off-policy correction against a float32 rollout: generation tokens/s, the log-prob gap,
the share of tokens the correction touches, and the final reward at equal steps.

    python benchmarks/rollout_precision.py [--sizes quickstart,33m] [--steps 40] [--rounds 3] [--seeds 0]
                                           [--correction cap|mask] [--warmup 2] [--json out.json]
    python benchmarks/rollout_precision.py --quick            # smoke test: 4 steps, 1 round, a tiny "33m"

Two configurations of one colocated recipe, both with a float32 actor (``roles.actor.model.dtype``):

- ``float32``: the hf engine samples with the actor's own weights (``rollout.dtype`` null);
- ``bf16+cap`` (default ``--correction cap``): ``rollout.dtype: bfloat16`` (the engine samples from a bf16 copy,
  ``rlhfctl/rollout/precision_replica.py``) with ``rollout.importance_cap: 2.0``, truncated importance sampling:
  every token's policy loss is weighed by min(pi_old / pi_engine, 2), so the small, systematic bf16 gap is corrected
  on every token; ``--correction mask`` uses ``rollout.importance_mask: [0.5, 2.0]`` instead (masked IS: a token
  whose ratio leaves the band drops out, the others keep weight 1, so the gap inside the band stays uncorrected).

Sizes: ``quickstart``, recipes/quickstart.yaml as shipped (16 prompts x 4, 24 new tokens, KL loss with a reference);
``33m``, the same recipe with async_step.py's 33.7M-parameter inline qwen2 at its batch (8 prompts x 4, 128 new
tokens). Every run is a fresh child process with its own private local Ray (async_step.py's ``run_config``): one
pool of one process reserving ``--threads`` CPUs, hence that many torch threads, for both configurations. Each round
runs both configurations for every seed, and the order flips every round, so a shared machine's drift hits both.

Reported per configuration, from each run's metrics.jsonl: generation tokens/s (each step's response tokens, prompts
x n x ``response_length/mean``, over its ``time/generate``; the median of the steps after ``--warmup``, so one step
slowed by a neighbour on a shared machine does not decide it; the JSON also has the sums' ratio; for bf16 this includes
copying the updated weights into the bf16 copy before each rollout), the mean ``rollout/logprob_diff`` (mean
|actor old log-prob - engine log-prob| per token; none for float32, whose engine is the actor), the mean share of
tokens capped (``actor/behav_imp_weight/capped_fraction``) or masked (``.../masked_fraction``), and the final reward
(mean ``reward/mean`` of the last 5 steps). The speed ratio (bf16 / float32 tokens/s) is taken within each round,
side by side, and its median reported.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from async_step import (FULL_MODEL, QUICK_MODEL, RECIPE, REWARD_WINDOW, RUN_FILES, configs, final_reward,
                        model_overrides, pick_cpus, placement_overrides, run_config)

BATCH = ["trainer.batch_size=8", "trainer.mini_batch_size=8", "rollout.n=4", "data.task=digits"]
"""The 33m size's batch: async_step.py's digits workload, 8 prompts x 4."""
COLOCATED = configs(1)["a"]

CORRECTIONS = {"cap": (["rollout.importance_cap=2.0"], "actor/behav_imp_weight/capped_fraction"),
               "mask": (["rollout.importance_mask=[0.5,2.0]"], "actor/behav_imp_weight/masked_fraction")}
DIFF_KEY = "rollout/logprob_diff"
FLOAT32, BF16 = "float32", "bf16"


def size_overrides(size: str, quick: bool) -> list[str]:
    """The recipe overrides of a size: none for the quickstart as shipped; the 33M model at async_step's batch."""
    if size == "quickstart":
        return []
    model, tokens = (QUICK_MODEL, 16) if quick else (FULL_MODEL, 128)
    return [*model_overrides(model), *BATCH, f"rollout.max_new_tokens={tokens}"]


def config_overrides(config: str, correction: str) -> list[str]:
    """float32: the actor's precision (rollout.dtype null); bf16: a bf16 engine with ``correction``'s key."""
    return [] if config == FLOAT32 else ["rollout.dtype=bfloat16", *CORRECTIONS[correction][0]]


def samples_per_step(overrides: list[str]) -> int:
    """Prompts x n of the resolved recipe: how many responses each step's ``response_length/mean`` averages."""
    from rlhfctl.recipe import load_recipe

    cfg = load_recipe(RECIPE, overrides)
    return int(cfg.trainer.batch_size) * int(cfg.rollout.n)


def summarize(result: dict[str, Any], samples: int, warmup: int, share_key: str) -> dict[str, Any]:
    """Generation tokens/s after the warm-up, the mean log-prob gap and corrected share, and the final reward."""
    records = result["records"]
    timed = records[warmup:] or records
    tokens = sum(samples * r["response_length/mean"] for r in timed)
    seconds = sum(r["time/generate"] for r in timed)
    per_step = [samples * r["response_length/mean"] / r["time/generate"] for r in timed]
    diffs = [r[DIFF_KEY] for r in records if DIFF_KEY in r]
    shares = [r[share_key] for r in records if share_key in r]
    return {"gen_tokens_per_s": statistics.median(per_step), "total_gen_tokens_per_s": tokens / seconds,
            "generate_s": seconds, "response_tokens": tokens,
            "logprob_diff": statistics.mean(diffs) if diffs else None,
            "logprob_diff_max": max(diffs) if diffs else None,
            "corrected_share": statistics.mean(shares) if shares else None,
            "corrected_share_max": max(shares) if shares else None,
            "final_reward": final_reward(records), "steps": len(records),
            "s_per_step": statistics.median(r["time/step"] for r in timed),
            "generate_seconds": [r["time/generate"] for r in records],
            "threads": result["threads"], "wall_s": result["wall_s"]}


def measure(args: argparse.Namespace, size: str) -> list[dict[str, Any]]:
    """Every round and seed: both configurations in fresh children, the order flipped every round."""
    # No overlap: with trainer.overlap_rollout the next step's generation runs behind this step's end, and
    # time/generate is only the wait for it (runs of 40 steps in 18 s read as 40,000 tokens/s).
    base = [*size_overrides(size, args.quick), *placement_overrides(COLOCATED, args.threads), *RUN_FILES,
            f"trainer.total_steps={args.steps}", "trainer.overlap_rollout=false"]
    samples = samples_per_step(base)
    share_key = CORRECTIONS[args.correction][1]
    rows, cpus = [], pick_cpus(args.threads)
    for round_index in range(args.rounds):
        order = [FLOAT32, BF16] if round_index % 2 == 0 else [BF16, FLOAT32]
        for seed in args.seeds:
            runs = {}
            for config in order:
                overrides = [*base, *config_overrides(config, args.correction), f"trainer.seed={seed}"]
                runs[config] = summarize(run_config(overrides, cpus, args.timeout), samples, args.warmup, share_key)
                run = runs[config]
                diff = "-" if run["logprob_diff"] is None else f"{run['logprob_diff']:.2e}"
                print(f"{size} round {round_index + 1} seed {seed} {label(config, args.correction)}: "
                      f"{run['gen_tokens_per_s']:.0f} gen tok/s, logprob_diff {diff}, final reward "
                      f"{run['final_reward']:.4f} ({run['steps']} steps, {run['threads']} threads, "
                      f"run {run['wall_s']:.0f} s)", flush=True)
            rows.append({"size": size, "round": round_index + 1, "seed": seed, "order": order, **runs,
                         "bf16_over_float32": runs[BF16]["gen_tokens_per_s"] / runs[FLOAT32]["gen_tokens_per_s"]})
    return rows


def label(config: str, correction: str) -> str:
    """The configuration as the table names it."""
    return FLOAT32 if config == FLOAT32 else f"bf16+{correction}"


def fmt(value: float | None, spec: str) -> str:
    """``value`` in ``spec``, or "-" where the configuration has no such metric."""
    return "-" if value is None else format(value, spec)


def mean_of(runs: list[dict[str, Any]], key: str) -> float | None:
    """The mean of ``key`` over runs that have it (None: none has it)."""
    values = [run[key] for run in runs if run[key] is not None]
    return statistics.mean(values) if values else None


def print_table(rows: list[dict[str, Any]], correction: str, steps: int) -> None:
    """One Markdown row per size and configuration, then the per-round speed ratios."""
    share = "capped" if correction == "cap" else "masked"
    print(f"\n| size | config | gen tok/s (rounds) | median | logprob_diff (mean) | {share} share (mean) "
          f"| final reward at step {steps} (per seed) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for size in dict.fromkeys(row["size"] for row in rows):
        mine = [row for row in rows if row["size"] == size]
        for config in (FLOAT32, BF16):
            runs = [row[config] for row in mine]
            speeds = ", ".join(f"{run['gen_tokens_per_s']:.0f}" for run in runs)
            seeds = dict.fromkeys(row["seed"] for row in mine)
            rewards = ", ".join(f"{statistics.mean(row[config]['final_reward'] for row in mine if row['seed'] == seed):.3f}"
                                for seed in seeds)
            print(f"| {size} | {label(config, correction)} | {speeds} | "
                  f"{statistics.median(run['gen_tokens_per_s'] for run in runs):.0f} | "
                  f"{fmt(mean_of(runs, 'logprob_diff'), '.2e')} | {fmt(mean_of(runs, 'corrected_share'), '.2%')} | "
                  f"{rewards} |")
    for size in dict.fromkeys(row["size"] for row in rows):
        ratios = [row["bf16_over_float32"] for row in rows if row["size"] == size]
        print(f"{size}: bf16 / float32 generation tokens/s per round and seed {', '.join(f'{r:.2f}' for r in ratios)}; "
              f"median {statistics.median(ratios):.2f}")
    print(f"gen tok/s: median over the steps after the warm-up of prompts x n x response_length/mean / time/generate; "
          f"final reward: mean "
          f"reward/mean of the last {REWARD_WINDOW} steps (rounds of one seed averaged)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="quickstart,33m", help="comma-separated: quickstart, 33m (default both)")
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default the quickstart's 40; 4 with --quick)")
    parser.add_argument("--rounds", type=int, default=None, help="alternations of the two configs (default 3; 1 with --quick)")
    parser.add_argument("--seeds", default="0", help="comma-separated trainer.seed values, each run every round (default 0)")
    parser.add_argument("--warmup", type=int, default=None, help="steps left out of tokens/s (default 2; 1 with --quick)")
    parser.add_argument("--correction", choices=sorted(CORRECTIONS), default="cap",
                        help="bf16's correction: cap (rollout.importance_cap 2.0, default) or mask (importance_mask [0.5, 2.0])")
    parser.add_argument("--threads", type=int, default=2, help="CPUs the pool reserves, hence torch threads (default 2)")
    parser.add_argument("--quick", action="store_true", help="smoke test: 4 steps, 1 round, '33m' shrunk to h64 x 2, 16 tokens")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds one run may take (default 3600)")
    parser.add_argument("--json", type=Path, default=None, help="also save every run's summary here")
    args = parser.parse_args()
    args.steps = args.steps or (4 if args.quick else 40)
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.warmup = (1 if args.quick else 2) if args.warmup is None else args.warmup
    args.seeds = [int(seed) for seed in args.seeds.split(",") if seed.strip()]
    sizes = [size.strip() for size in args.sizes.split(",") if size.strip()]
    if bad := [size for size in sizes if size not in ("quickstart", "33m")]:
        parser.error(f"unknown size(s) {bad}; choose from quickstart, 33m")
    if args.steps <= args.warmup or args.rounds < 1 or not args.seeds:
        parser.error("--steps must exceed --warmup, --rounds be at least 1, and --seeds name one seed at least")
    started = time.perf_counter()
    print(f"float32 actor; float32 rollout vs bf16 rollout with {CORRECTIONS[args.correction][0][0]}; {args.steps} steps, "
          f"{args.rounds} rounds, seeds {args.seeds}, {args.threads} torch threads per run", flush=True)
    rows = [row for size in sizes for row in measure(args, size)]
    print_table(rows, args.correction, args.steps)
    print(f"total wall time {time.perf_counter() - started:.0f} s")
    if args.json:
        args.json.write_text(json.dumps({"steps": args.steps, "rounds": args.rounds, "seeds": args.seeds,
                                         "warmup": args.warmup, "correction": args.correction,
                                         "threads": args.threads, "quick": args.quick, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
