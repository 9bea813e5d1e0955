"""Steps per second of a GRPO step, colocated vs a rollout group on its own pool at staleness 0, 1, 2.

    python benchmarks/async_step.py [--rounds 3] [--steps 8] [--warmup 2] [--trace] [--json out.json]
    python benchmarks/async_step.py --quick                      # tiny model, 16 tokens, 3 steps
    python benchmarks/async_step.py --reward [--seeds 0,1]       # quickstart's final reward at k=0 vs k=1

Every run is a fresh child process with its own private local Ray, sized to its pools (one CPU per
process, one torch thread per process). Configurations alternate round by round, the order flipped each
round, so drift on a shared machine hits all of them alike. A step's time is the wall-clock between the
driver's step records after the warm-up steps; with ``trainer.max_staleness`` above 0 this counts what
the actor waits for, which ``time/step`` of a step that overlaps its rollout would hide.

``--trace`` records a dispatch trace of the k=1 runs and reports how many seconds a
``rollout.generate_sequences`` rank span overlaps an ``actor.update_actor`` rank span.

``--reward`` runs the quickstart recipe as shipped (40 steps) with the separate placement at k=0 and k=1
and compares the mean ``reward/mean`` of the last 5 steps.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RECIPE = Path(__file__).resolve().parent.parent / "recipes" / "quickstart.yaml"
MODEL_KEY = "roles.actor.model.config"
# The size: about 33.7M parameters with the character tokenizer's embeddings (head dim 128).
FULL_MODEL = {"hidden_size": 512, "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 4,
              "intermediate_size": 2048, "max_position_embeddings": 256}
QUICK_MODEL = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
               "intermediate_size": 128, "max_position_embeddings": 128}
BATCH = ["trainer.batch_size=8", "trainer.mini_batch_size=8", "rollout.n=4", "data.task=digits"]
RUN_FILES = ["trainer.val_every=0", "trainer.save_every=0", "trainer.log_every=1", "trainer.loggers=[console,jsonl]"]
# (label, staleness or None for the colocated, on-policy run)
CONFIGS = [("a colocated", None), ("b separate k=0", 0), ("c separate k=1", 1), ("d separate k=2", 2)]
TRACED_STALENESS = 1
REWARD_WINDOW = 5
REWARD_TARGET = 0.10


def placement_overrides(staleness: int | None, cpus: int = 1) -> list[str]:
    """Pools of one process and ``cpus`` CPUs each: main (actor, reference, reward) and, when separate, gen (rollout)."""
    pools = [f"resource_pools.main.num_cpus_per_process={cpus}"]
    if staleness is None:
        return [*pools, "rollout.placement=colocated", "trainer.max_staleness=0", f"ray.num_cpus={cpus}"]
    return [*pools, f"resource_pools.gen={{process_on_nodes: [1], use_gpu: false, num_cpus_per_process: {cpus}}}",
            "rollout.placement=separate", "rollout.pool=gen", f"trainer.max_staleness={staleness}", f"ray.num_cpus={2 * cpus}"]


def model_overrides(model: dict[str, int]) -> list[str]:
    """The inline qwen2 architecture as recipe overrides."""
    return [f"{MODEL_KEY}.{key}={value}" for key, value in model.items()]


class StepClock:
    """A reporter that notes the wall-clock time each step's record is written."""

    def __init__(self) -> None:
        self.ends: list[float] = []

    def step_finished(self, step: int, metrics: dict[str, Any]) -> None:
        self.ends.append(time.perf_counter())

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


def child(spec_path: Path) -> None:
    """Run one recipe in this process (its own private Ray) and write what the parent reads next to the spec."""
    from rlhfctl.recipe import load_recipe
    from rlhfctl.recipe.resolved import resolve
    from rlhfctl.trainer import role_groups, run_training

    spec = json.loads(spec_path.read_text())
    cfg = load_recipe(RECIPE, spec["overrides"])
    # Each pool reserves 1 CPU per process, so each process runs 1 torch thread (role_groups' rule).
    threads = role_groups.cpu_threads_per_process(resolve(cfg), str(cfg.roles.actor.pool))
    clock = StepClock()
    started = time.perf_counter()
    run_training(cfg, clock)
    out = Path(cfg.trainer.output_dir)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    result = {"records": records, "step_ends": [end - started for end in clock.ends],
              "threads": threads, "run_s": time.perf_counter() - started}
    if cfg.trainer.trace:
        result["overlap"] = overlap_seconds(out / "trace.json")
    (spec_path.parent / "result.json").write_text(json.dumps(result))


def run_config(overrides: list[str], timeout_s: float) -> dict[str, Any]:
    """One run in a fresh child process; returns its records, step end times and thread counts."""
    with tempfile.TemporaryDirectory(prefix="async_step_") as tmp:
        spec_path = Path(tmp) / "spec.json"
        spec = {"overrides": [*overrides, f"trainer.output_dir={tmp}/run"]}
        spec_path.write_text(json.dumps(spec))
        started = time.perf_counter()
        done = subprocess.run([sys.executable, __file__, "--child", str(spec_path)], timeout=timeout_s,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"run failed (exit {done.returncode}): {' '.join(overrides)}\n{done.stderr[-3000:]}")
        result = json.loads((Path(tmp) / "result.json").read_text())
    result["wall_s"] = time.perf_counter() - started
    return result


def merged(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of intervals as sorted, disjoint intervals."""
    out: list[tuple[float, float]] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def overlap_seconds(trace_path: Path) -> dict[str, float]:
    """Seconds where some rollout.generate_sequences rank span overlaps some actor.update_actor rank span."""
    events = json.loads(trace_path.read_text())["traceEvents"]

    def spans(name: str) -> list[tuple[float, float]]:
        return merged([(e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6) for e in events
                       if e.get("ph") == "X" and e.get("pid", 0) != 0 and e.get("name") == name])

    generate, update = spans("rollout.generate_sequences"), spans("actor.update_actor")
    both = sum(max(0.0, min(g_end, u_end) - max(g_start, u_start))
               for g_start, g_end in generate for u_start, u_end in update)
    return {"overlap_s": both, "generate_s": sum(e - s for s, e in generate), "update_s": sum(e - s for s, e in update)}


def summarize(result: dict[str, Any], warmup: int) -> dict[str, Any]:
    """Median wall-clock seconds per step after the warm-up, and the phase medians of the same steps."""
    ends, records = result["step_ends"], result["records"]
    per_step = [later - earlier for earlier, later in zip(ends[warmup - 1:], ends[warmup:])]
    timed = records[warmup:]

    def median(key: str) -> float:
        values = [r[key] for r in timed if key in r]
        return statistics.median(values) if values else float("nan")

    return {"s_per_step": statistics.median(per_step), "step_seconds": per_step,
            "window_s_per_step": (ends[-1] - ends[warmup - 1]) / (len(ends) - warmup),
            **{key: median(key) for key in ("time/step", "time/generate", "time/update_actor", "time/weight_sync",
                                              "response_length/mean", "response_length/max", "rollout/staleness/mean")},
            "threads": result["threads"], "wall_s": result["wall_s"],
            **({"overlap": result["overlap"]} if "overlap" in result else {})}


def speed(args: argparse.Namespace) -> dict[str, Any]:
    """Alternate the four configurations ``--rounds`` times, flipping the order each round."""
    model = QUICK_MODEL if args.quick else FULL_MODEL
    tokens = 16 if args.quick else 128
    base = [*model_overrides(model), *BATCH, f"rollout.max_new_tokens={tokens}", *RUN_FILES,
            f"trainer.total_steps={args.steps}", "trainer.seed=0"]
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from flops import model_parameters

    parameters = model_parameters({"config": {"model_type": "qwen2", **model}})
    print(f"model: qwen2 {model}, {parameters / 1e6:.2f}M parameters; 8 prompts x 4 samples, {tokens} new tokens; "
          f"{args.steps} steps, medians after {args.warmup} warm-up", flush=True)
    rounds: list[dict[str, dict[str, Any]]] = []
    for round_index in range(args.rounds):
        order = CONFIGS if round_index % 2 == 0 else CONFIGS[::-1]
        measured = {}
        for label, staleness in order:
            traced = args.trace and staleness == TRACED_STALENESS
            overrides = [*base, *placement_overrides(staleness, args.threads), f"trainer.trace={str(traced).lower()}"]
            measured[label] = summarize(run_config(overrides, args.timeout), args.warmup)
            print(f"round {round_index + 1} {label}: {measured[label]['s_per_step']:.3f} s/step "
                  f"(run {measured[label]['wall_s']:.0f} s)", flush=True)
        rounds.append(measured)
    return {"model": model, "parameters": parameters, "new_tokens": tokens, "steps": args.steps,
            "warmup": args.warmup, "rounds": rounds}


def cell(seconds: float, width: int) -> str:
    """Seconds right-aligned in ``width`` ("-" where the run had no such phase)."""
    return f"{'-' if seconds != seconds else f'{seconds:.3f}':>{width}}"


def print_speed(report: dict[str, Any]) -> None:
    """The table: s/step per round, steps/s and ratio vs (a) of the medians, and phase medians."""
    rounds = report["rounds"]
    base = statistics.median(r[CONFIGS[0][0]]["s_per_step"] for r in rounds)
    cells = "".join(f"{f'r{i + 1} s/step':>11}" for i in range(len(rounds)))
    print(f"\n{'config':<16}{cells}{'steps/s':>9}{'vs (a)':>8}{'generate':>10}{'update':>8}{'w.sync':>8}"
          f"{'resp len':>10}{'threads':>9}")
    for label, _ in CONFIGS:
        runs = [r[label] for r in rounds]
        s_per_step = statistics.median(run["s_per_step"] for run in runs)
        phases = [statistics.median(run[key] for run in runs)
                  for key in ("time/generate", "time/update_actor", "time/weight_sync")]
        length = statistics.median(run["response_length/mean"] for run in runs)
        threads = str(runs[0]["threads"])
        per_round = "".join(f"{run['s_per_step']:>11.3f}" for run in runs)
        print(f"{label:<16}{per_round}{1 / s_per_step:>9.3f}{base / s_per_step:>8.2f}"
              f"{cell(phases[0], 10)}{cell(phases[1], 8)}{cell(phases[2], 8)}{length:>10.1f}{threads:>9}")
    print("s/step: median wall-clock between step records after the warm-up; vs (a): steps/s over (a)'s; "
          "phases: medians of time/*; threads: torch threads per worker process")
    for index, measured in enumerate(rounds):
        for label, run in measured.items():
            if "overlap" in run:
                o = run["overlap"]
                share = o["overlap_s"] / o["update_s"] if o["update_s"] else float("nan")
                print(f"round {index + 1} {label}: rollout.generate_sequences overlaps actor.update_actor for "
                      f"{o['overlap_s']:.2f} s ({share:.0%} of {o['update_s']:.2f} s of updates, "
                      f"{o['generate_s']:.2f} s of generation)")


def final_reward(records: list[dict[str, Any]]) -> float:
    """Mean reward/mean of the last REWARD_WINDOW steps."""
    return statistics.mean(r["reward/mean"] for r in records[-REWARD_WINDOW:])


def reward(args: argparse.Namespace) -> dict[str, Any]:
    """The quickstart as shipped, separate at k=0 and k=1, per seed; the final rewards and their difference."""
    rows = []
    for index, seed in enumerate(args.seeds):
        order = [0, 1] if index % 2 == 0 else [1, 0]
        finals = {}
        for staleness in order:
            steps = [f"trainer.total_steps={args.steps}"] if args.steps else []
            overrides = [*placement_overrides(staleness, args.threads), *RUN_FILES, *steps, f"trainer.seed={seed}"]
            result = run_config(overrides, args.timeout)
            finals[staleness] = final_reward(result["records"])
            print(f"seed {seed} k={staleness}: final reward {finals[staleness]:.4f} "
                  f"({len(result['records'])} steps, run {result['wall_s']:.0f} s)", flush=True)
        relative = abs(finals[1] - finals[0]) / abs(finals[0]) if finals[0] else float("inf")
        rows.append({"seed": seed, "k0": finals[0], "k1": finals[1], "relative_diff": relative})
    print(f"\n{'seed':>5}{'k=0':>9}{'k=1':>9}{'rel. diff':>11}  within {REWARD_TARGET:.0%}")
    for row in rows:
        print(f"{row['seed']:>5}{row['k0']:>9.4f}{row['k1']:>9.4f}{row['relative_diff']:>11.1%}  "
              f"{'yes' if row['relative_diff'] <= REWARD_TARGET else 'no'}")
    print(f"final reward: mean reward/mean over the last {REWARD_WINDOW} steps (or all, if fewer) "
          f"of recipes/quickstart.yaml, {args.steps or 'its own'} steps")
    return {"rows": rows, "window": REWARD_WINDOW, "target": REWARD_TARGET}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=None,
                        help="alternations of the four configs (default 3; 1 with --quick)")
    parser.add_argument("--steps", type=int, default=None,
                        help="steps per run, warm-up included (default 8; 3 with --quick; --reward: the recipe's 40)")
    parser.add_argument("--warmup", type=int, default=None, help="steps left out of the medians (default 2; 1 with --quick)")
    parser.add_argument("--quick", action="store_true", help="smoke test: hidden 64, 2 layers, 16 new tokens, 3 steps")
    parser.add_argument("--trace", action="store_true", help="trace the k=1 runs and report the generate/update overlap")
    parser.add_argument("--reward", action="store_true", help="final reward of the quickstart at k=0 vs k=1 instead")
    parser.add_argument("--seeds", default="0", help="--reward: comma-separated trainer.seed values (default 0)")
    parser.add_argument("--threads", type=int, default=1, help="CPUs each pool reserves per process, hence torch threads per worker (default 1)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds one run may take (default 3600)")
    parser.add_argument("--json", type=Path, default=None, help="also save every measurement here")
    parser.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.warmup = (1 if args.quick else 2) if args.warmup is None else args.warmup
    if args.reward:  # the recipe's own 40 steps unless --steps or --quick says otherwise
        args.steps = args.steps or (3 if args.quick else None)
    else:
        args.steps = args.steps or (3 if args.quick else 8)
        if args.warmup < 1 or args.steps <= args.warmup or args.rounds < 1:
            parser.error("--warmup must be at least 1, --steps exceed it, and --rounds be at least 1")
    args.seeds = [int(seed) for seed in args.seeds.split(",") if seed.strip()]
    started = time.perf_counter()
    report = reward(args) if args.reward else speed(args)
    if not args.reward:
        print_speed(report)
    print(f"total wall time {time.perf_counter() - started:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
