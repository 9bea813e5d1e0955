"""Does a partial rollout learn as the synchronous step does? The final reward at equal trained samples, per seed.

    python benchmarks/partial_learning.py --model-path /tmp/sft33/model [--steps 24] [--seeds 0,1] [--partial 32] [--lr 1e-4]
    python benchmarks/partial_learning.py --quick                    # tiny model, 16 tokens, 6 steps, one seed

Each seed runs (a) the synchronous colocated step for ``--steps`` steps and (p-co) partial rollouts colocated
(``rollout.partial.max_tokens_per_step``, ``trainer.max_staleness`` ``--partial-staleness``, ``importance_cap 2.0``)
until it has trained at least as many samples, on the same cores and threads (``benchmarks/async_step.py``'s runs:
fresh child processes, pinned, 2 torch threads). A partial step trains at most the synchronous step's batch, often
fewer, so it runs more steps (``--extra`` of them at most).

The final reward is the held-out reward (``val/reward/mean``: ``--val-prompts`` prompts answered greedily every
``--val-every`` steps), averaged over the validations in the window, weighted by the samples each step trained, over the last ``--window`` synchronous batches' worth of
trained samples, ending where the synchronous run ends: the same number of samples on both sides. The training batches'
own reward is printed beside it but is not the measure: a partial step trains the groups that finished first, the short
answers, so its batches are easier than the synchronous step's. The target is a relative difference within 5%. The
seconds each side took are reported too, but validation runs inside them: take speed from ``async_step.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from async_step import (FULL_MODEL, MODEL_KEY, QUICK_MODEL, RUN_FILES, configs, model_overrides,  # noqa: E402
                        pick_cpus, placement_overrides, run_config, task_overrides, with_positions)

TARGET = 0.05
VAL_KEY = "val/reward/mean"
# what ``--json`` keeps of each step, to see how a run got where it ended
KEPT = ("step", "reward/mean", VAL_KEY, "response_length/mean", "response_length/max", "rollout/partial/carried",
        "rollout/partial/dropped", "rollout/partial/trained_samples", "rollout/partial/segments/mean", "time/step")


def trained(record: dict[str, Any], full_batch: int) -> float:
    """Samples a step trained: its partial count, else the full batch."""
    return float(record.get("rollout/partial/trained_samples", full_batch))


def reward_at(records: list[dict[str, Any]], full_batch: int, until: float, window: float,
              key: str = "reward/mean") -> float:
    """The sample-weighted mean of ``key`` (a step's training batch reward, or its held-out validation reward) over the
    steps that trained the samples in (until - window, until]."""
    total = weighted = seen = 0.0
    for record in records:
        count = trained(record, full_batch)
        low, high = seen, seen + count
        seen = high
        share = max(0.0, min(high, until) - max(low, until - window))
        if key in record:  # validation runs every --val-every steps
            weighted += share * record[key]
            total += share
        if seen >= until:
            break
    if seen < until:
        raise RuntimeError(f"the run trained {seen:.0f} samples, fewer than the {until:.0f} compared; raise --extra")
    if not total:
        raise RuntimeError(f"no step in the compared window logged {key}; lower --val-every or widen --window")
    return weighted / total


def up_to(records: list[dict[str, Any]], step_ends: list[list[float]], full_batch: int, until: float) -> dict[str, float]:
    """Where a run reaches ``until`` trained samples: its step, the seconds since its first step ended, the response
    tokens trained by then, and the samples still carried (generated in part, not trained yet)."""
    seen = tokens = 0.0
    ends = dict((int(step), float(end)) for step, end in step_ends)
    for record in records:
        count = trained(record, full_batch)
        seen += count
        tokens += count * record["response_length/mean"]
        if seen >= until:
            step = int(record["step"])
            return {"step": step, "seconds": ends[step] - ends[1], "response_tokens": tokens,
                    "carried": float(record.get("rollout/partial/carried", 0.0))}
    raise RuntimeError(f"the run trained {seen:.0f} samples, fewer than the {until:.0f} compared; raise --extra")


def main() -> None:
    """Both configurations per seed; prints the table and writes ``--json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", type=Path, default=None, help="an HF model directory to start from (an SFT export)")
    parser.add_argument("--task", default="repeat?max_len=256&alpha=1.2")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--steps", type=int, default=24, help="steps of the synchronous run (default 24)")
    parser.add_argument("--extra", type=int, default=None, help="most extra steps of the partial run (default steps // 2)")
    parser.add_argument("--window", type=int, default=6, help="batches of samples the final reward averages (default 6)")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--partial", type=int, default=32, help="rollout.partial.max_tokens_per_step (default 32)")
    parser.add_argument("--partial-staleness", type=int, default=4)
    parser.add_argument("--lr", type=float, default=None,
                        help="roles.actor.optim.lr of both runs (default the quickstart's 1e-3; at 33M one update at "
                             "1e-3 moves a token's log-prob by about 0.4 on average, so any carried token is far off-policy)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--val-prompts", type=int, default=32, help="held-out prompts, scored greedily (default 32)")
    parser.add_argument("--val-every", type=int, default=4, help="steps between validations (default 4)")
    parser.add_argument("--quick", action="store_true", help="tiny model, 16 tokens, 6 steps, seed 0")
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.quick:
        args.max_new_tokens, args.steps, args.seeds, args.window, args.partial, args.val_every = 16, 6, "0", 2, 4, 1
    extra = args.extra if args.extra is not None else max(2, args.steps // 2)
    task, prompt_tokens = task_overrides(args.task, args.max_new_tokens)
    if args.model_path is not None:
        architecture = [f"roles.actor.model.path={args.model_path}", f"{MODEL_KEY}=null"]
    else:
        model = with_positions(QUICK_MODEL if args.quick else FULL_MODEL, prompt_tokens + args.max_new_tokens)
        architecture = model_overrides(model)
    base = [*architecture, *task, f"trainer.batch_size={args.batch}", f"trainer.mini_batch_size={args.batch}",
            f"rollout.n={args.n}", *RUN_FILES, f"trainer.val_every={args.val_every}", f"data.num_val={args.val_prompts}",
            *([f"roles.actor.optim.lr={args.lr}"] if args.lr is not None else [])]
    full_batch, cpus, by_key = args.batch * args.n, pick_cpus(args.cores), configs(args.partial_staleness)
    until, window = float(args.steps * full_batch), float(args.window * full_batch)
    rows = []
    for index, seed in enumerate(int(part) for part in args.seeds.split(",")):
        order = ["a", "p-co"] if index % 2 == 0 else ["p-co", "a"]
        finals, runs = {}, {}
        for key in order:
            config = by_key[key]
            steps = args.steps + (extra if config.partial else 0)
            overrides = [*base, *placement_overrides(config, args.cores, args.partial), f"trainer.total_steps={steps}",
                         f"trainer.seed={seed}"]
            result = run_config(overrides, cpus, args.timeout)
            records = result["records"]
            finals[key] = reward_at(records, full_batch, until, window, VAL_KEY)
            finals[f"{key} train"] = reward_at(records, full_batch, until, window)
            reached = up_to(records, result["step_ends"], full_batch, until)
            runs[key] = {"steps": len(records), "trained": sum(trained(r, full_batch) for r in records),
                         "wall_s": result["wall_s"], "dropped": sum(r.get("rollout/partial/dropped", 0) for r in records),
                         **reached, "records": [{k: v for k, v in r.items() if k in KEPT} for r in records]}
            print(f"seed {seed} {config.label}: held-out reward {finals[key]:.4f} (training batches "
                  f"{finals[key + ' train']:.4f}) at {until:.0f} samples, reached at step "
                  f"{reached['step']} after {reached['seconds']:.1f} s ({reached['response_tokens']:.0f} response "
                  f"tokens trained, {reached['carried']:.0f} carried); {len(records)} steps, "
                  f"{runs[key]['dropped']:.0f} dropped, run {result['wall_s']:.0f} s", flush=True)
        relative = abs(finals["p-co"] - finals["a"]) / abs(finals["a"]) if finals["a"] else float("inf")
        rows.append({"seed": seed, "sync": finals["a"], "partial": finals["p-co"], "relative_diff": relative, "runs": runs,
                     "sync_train": finals["a train"], "partial_train": finals["p-co train"]})
    print(f"\n{'seed':>5}{'sync':>9}{'partial':>9}{'rel. diff':>11}  within {TARGET:.0%}  {'s sync':>8}{'s partial':>10}"
          f"{'speed-up':>9}")
    for row in rows:
        sync_s, partial_s = row["runs"]["a"]["seconds"], row["runs"]["p-co"]["seconds"]
        print(f"{row['seed']:>5}{row['sync']:>9.4f}{row['partial']:>9.4f}{row['relative_diff']:>11.1%}  "
              f"{'yes' if row['relative_diff'] <= TARGET else 'no':>9}  {sync_s:>8.1f}{partial_s:>10.1f}"
              f"{sync_s / partial_s:>9.2f}")
    print("seconds: from the end of step 1 to the step where the run has trained the compared samples")
    print(f"final reward: the held-out {VAL_KEY}, sample-weighted over samples {until - window:.0f}-{until:.0f} of each run; "
          f"task {args.task}, {args.batch} x {args.n}, up to {args.max_new_tokens} tokens, partial budget {args.partial}, "
          f"max_staleness {args.partial_staleness}, lr {args.lr or 'as the recipe'}; cores {cpus}")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "until": until, "window": window}, indent=1))


if __name__ == "__main__":
    main()
