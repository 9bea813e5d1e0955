"""Trained samples per second of a GRPO step, colocated vs a rollout on its own pool, on the same cores and threads.

    python benchmarks/async_step.py [--rounds 3] [--steps 8] [--warmup 2] [--trace] [--json out.json]
    python benchmarks/async_step.py --task 'repeat?max_len=256&alpha=1.2' --partial 64   # + partial rollouts
    python benchmarks/async_step.py --quick                      # tiny model, 16 tokens, 3 steps, 1 round
    python benchmarks/async_step.py --dry-run [--partial 64]     # validate every configuration, train nothing
    python benchmarks/async_step.py --reward [--seeds 0,1]       # quickstart's final reward at k=0 vs k=1

Every configuration gets the same ``--cores`` (default 2) and the same number of torch threads in all:

- (a) colocated: one process (actor, reference, reward) with ``num_cpus_per_process: 2``, so 2 threads;
- (c) separate, k=1: the actor's pool 1 CPU / 1 thread, the rollout pool 1 CPU / 1 thread;
- (b) k=0 and (d) k=2 (``--configs``): (c)'s pools at another staleness;
- (p-co) and (p-sep) with ``--partial TOKENS``: ``rollout.partial.max_tokens_per_step=TOKENS`` colocated on 2
  threads and separate on 1 + 1, at ``trainer.max_staleness`` ``--partial-staleness`` (default 4), with
  ``rollout.importance_cap: 2.0``. ``--model-path`` starts every run from a trained policy (an SFT export).

Each run is a fresh child process with its own private local Ray of ``ray.num_cpus = --cores``, pinned
(``sched_setaffinity``, inherited by Ray and its workers) to the same ``--cores`` cores of this machine, so a
bigger machine does not lend the separate runs spare cores. The threads are checked, not assumed: a pool
that reserves whole CPUs per process gives each process that many torch threads
(``role_groups.cpu_threads_per_process``, set by ``torch.set_num_threads`` in ``WorkerHost.build``), and each
worker reports ``torch.get_num_threads()`` in ``workers.json``; a run whose workers ran other counts than its
row claims is an error. Configurations alternate round by round, the order flipped each round, so drift on a
shared machine hits all of them alike.

Rate: samples/s is the trained samples of the steps after the warm-up over the wall-clock between the step
record that ends the warm-up and the last one (measured in the driver as each step is logged, so it counts
what the actor waits for, which ``time/step`` of a step that overlaps its rollout would hide). A step trains
``trainer.batch_size * rollout.n`` samples, except with partial rollouts, where it trains the groups whose
samples all finished: the count is the step's ``rollout/partial/trained_samples`` in ``metrics.jsonl``.

Every configuration is first checked with ``rlhfctl validate``; a partial row whose recipe does not validate
(``rollout.partial`` not in the schema yet, say) is skipped with the validator's message, not faked.

``--trace`` records a dispatch trace of the separate runs that run ahead (k >= 1) and reports how many seconds
a ``rollout.generate_sequences`` rank span overlaps an ``actor.update_actor`` rank span.

``--reward`` runs the quickstart recipe as shipped (40 steps) with the separate placement at k=0 and k=1
(1 + 1 threads) and compares the mean ``reward/mean`` of the last 5 steps.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "recipes" / "quickstart.yaml"
MODEL_KEY = "roles.actor.model.config"
# The size: about 33.7M parameters with the character tokenizer's embeddings (head dim 128).
# Positions are raised to prompt + response by the script (rotary: no parameters, the size stays the same).
FULL_MODEL = {"hidden_size": 512, "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 4,
              "intermediate_size": 2048, "max_position_embeddings": 256}
QUICK_MODEL = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
               "intermediate_size": 128, "max_position_embeddings": 128}
DIGITS_PROMPT_TOKENS = 32  # the quickstart's data.max_prompt_length
RUN_FILES = ["trainer.val_every=0", "trainer.save_every=0", "trainer.log_every=1", "trainer.loggers=[console,jsonl]"]
TRAINED_SAMPLES_KEY = "rollout/partial/trained_samples"
ROLLOUT_ROLE = "rollout"
REWARD_WINDOW = 5
REWARD_TARGET = 0.10


@dataclass(frozen=True)
class Config:
    """One row of the table: where the rollout runs, how far ahead, and whether it is cut into partial rollouts."""

    key: str
    label: str
    separate: bool
    staleness: int
    partial: bool = False


def configs(partial_staleness: int) -> dict[str, Config]:
    """Every configuration the script can run, by its ``--configs`` key."""
    k = partial_staleness
    return {c.key: c for c in [
        Config("a", "(a) colocated", False, 0),
        Config("b", "(b) separate k=0", True, 0),
        Config("c", "(c) separate k=1", True, 1),
        Config("d", "(d) separate k=2", True, 2),
        Config("p-co", f"(p-co) partial k={k}", False, k, partial=True),
        Config("p-sep", f"(p-sep) partial sep k={k}", True, k, partial=True),
    ]}


def placement_overrides(config: Config, cores: int, partial_tokens: int | None = None) -> list[str]:
    """The pools of ``config`` on ``cores`` CPUs in all: one process of ``cores``, or two of ``cores // 2``."""
    share = cores // 2 if config.separate else cores
    out = [f"resource_pools.main.num_cpus_per_process={share}", f"trainer.max_staleness={config.staleness}",
           f"ray.num_cpus={cores}"]
    if config.separate:
        out += [f"resource_pools.gen={{process_on_nodes: [1], use_gpu: false, num_cpus_per_process: {share}}}",
                "rollout.placement=separate", "rollout.pool=gen"]
    else:
        out += ["rollout.placement=colocated"]
    if config.partial:  # with the correction a user would run for the carried samples' older tokens
        out += [f"rollout.partial.max_tokens_per_step={partial_tokens}", "rollout.importance_cap=2.0"]
    return out


def expected_threads(config: Config, cores: int) -> dict[str, int]:
    """Torch threads per process the row claims: the actor's process and, when separate, the rollout's."""
    if config.separate:
        return {"actor": cores // 2, ROLLOUT_ROLE: cores // 2}
    return {"actor": cores}


def task_overrides(task: str, new_tokens: int) -> tuple[list[str], int]:
    """The data and reward overrides of a bundled task, and its prompt length in tokens.

    The reward is the task module's ``score``; ``repeat`` needs ``len("repeat :") + max_len`` prompt tokens.
    """
    base = task.partition("?")[0]
    prompt_tokens = DIGITS_PROMPT_TOKENS
    if base == "repeat":
        from rlhfctl.tasks import repeat  # only the task's settings: no torch, no Ray
        from rlhfctl.tasks.task_query import parse_query, split_name

        settings = repeat.settings_of(task, parse_query(task, split_name(task)[1]))
        prompt_tokens = max(prompt_tokens, len(repeat.PROMPT_PREFIX) + 1 + settings.max_len)
    return [f"data.task={task}", f"roles.reward.function=rlhfctl.tasks.{base}:score",
            f"data.max_prompt_length={prompt_tokens}", f"rollout.max_new_tokens={new_tokens}"], prompt_tokens


def with_positions(model: dict[str, int], positions: int) -> dict[str, int]:
    """The architecture with at least ``positions`` positions (rotary: the parameter count does not change)."""
    return {**model, "max_position_embeddings": max(model["max_position_embeddings"], positions)}


def model_overrides(model: dict[str, int]) -> list[str]:
    """The inline qwen2 architecture as recipe overrides."""
    return [f"{MODEL_KEY}.{key}={value}" for key, value in model.items()]


class StepClock:
    """A reporter that notes the wall-clock time each step's record is written, and the workers' CPUs once."""

    def __init__(self, output_dir: Path) -> None:
        self.output_dir = output_dir
        self.ends: list[tuple[int, float]] = []
        self.affinity: dict[str, list[list[int]]] = {}

    def step_finished(self, step: int, metrics: dict[str, Any]) -> None:
        self.ends.append((step, time.perf_counter()))
        if not self.affinity:  # the workers are alive now: read the cores each one may run on
            workers = json.loads((self.output_dir / "workers.json").read_text())
            self.affinity = {role: [sorted(os.sched_getaffinity(rank["pid"])) for rank in ranks]
                             for role, ranks in workers.items()}

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


def child(spec_path: Path) -> None:
    """Run one recipe in this process (its own private Ray) and write what the parent reads next to the spec."""
    spec = json.loads(spec_path.read_text())
    os.sched_setaffinity(0, spec["cpus"])  # before Ray starts: its processes and the workers inherit it
    from rlhfctl.recipe import load_recipe
    from rlhfctl.trainer import run_training

    cfg = load_recipe(RECIPE, spec["overrides"])
    out = Path(cfg.trainer.output_dir)
    clock = StepClock(out)
    started = time.perf_counter()
    run_training(cfg, clock)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    workers = json.loads((out / "workers.json").read_text())
    result = {"records": records, "step_ends": [(step, end - started) for step, end in clock.ends],
              "threads": {role: [rank.get("torch_threads") for rank in ranks] for role, ranks in workers.items()},
              "affinity": clock.affinity, "run_s": time.perf_counter() - started}
    if cfg.trainer.trace:
        result["overlap"] = overlap_seconds(out / "trace.json")
    (spec_path.parent / "result.json").write_text(json.dumps(result))


def run_config(overrides: list[str], cpus: list[int], timeout_s: float) -> dict[str, Any]:
    """One run in a fresh child process pinned to ``cpus``; returns its records, step end times and threads."""
    with tempfile.TemporaryDirectory(prefix="async_step_") as tmp:
        spec_path = Path(tmp) / "spec.json"
        spec = {"overrides": [*overrides, f"trainer.output_dir={tmp}/run"], "cpus": cpus}
        spec_path.write_text(json.dumps(spec))
        started = time.perf_counter()
        done = subprocess.run([sys.executable, __file__, "--child", str(spec_path)], timeout=timeout_s,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"run failed (exit {done.returncode}): {' '.join(overrides)}\n{done.stderr[-3000:]}")
        result = json.loads((Path(tmp) / "result.json").read_text())
    result["wall_s"] = time.perf_counter() - started
    return result


def validation_errors(overrides: list[str]) -> list[str]:
    """``rlhfctl validate`` on the run's recipe: its error messages, none when the recipe is valid."""
    with tempfile.TemporaryDirectory(prefix="async_step_validate_") as tmp:
        command = [sys.executable, "-m", "rlhfctl.cli", "validate", str(RECIPE), *overrides,
                   f"trainer.output_dir={tmp}/run", "--format", "json"]
        done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=300)
    if done.returncode == 0:
        return []
    try:
        return [error["message"] for error in json.loads(done.stdout)["errors"]] or [done.stderr.strip()]
    except (json.JSONDecodeError, KeyError):
        return [(done.stderr or done.stdout).strip()[-2000:] or f"exit {done.returncode}"]


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


def trained_samples(record: dict[str, Any], config: Config, full_batch: int) -> int:
    """Samples a step trained: the whole batch, or with partial rollouts the count the run logged."""
    if not config.partial:
        return full_batch
    if TRAINED_SAMPLES_KEY not in record:
        raise RuntimeError(f"{config.label}: step {record.get('step')} has no {TRAINED_SAMPLES_KEY} in metrics.jsonl, "
                           "so its trained samples are unknown; the partial rollouts must log it")
    return int(record[TRAINED_SAMPLES_KEY])


def summarize(result: dict[str, Any], config: Config, warmup: int, full_batch: int) -> dict[str, Any]:
    """Trained samples/s and s/step after the warm-up, the phase medians of the same steps, threads and cores."""
    steps, ends = zip(*result["step_ends"])
    by_step = {r["step"]: r for r in result["records"]}
    timed = [by_step[step] for step in steps[warmup:]]
    samples = [trained_samples(r, config, full_batch) for r in timed]
    window = ends[-1] - ends[warmup - 1]
    per_step = [later - earlier for earlier, later in zip(ends[warmup - 1:], ends[warmup:])]

    def median(key: str) -> float:
        values = [r[key] for r in timed if key in r]
        return statistics.median(values) if values else float("nan")

    return {"samples_per_s": sum(samples) / window, "trained_samples": samples, "window_s": window,
            "s_per_step": statistics.median(per_step), "step_seconds": per_step,
            **{key: median(key) for key in ("time/step", "time/generate", "time/update_actor", "time/weight_sync",
                                              "response_length/mean", "response_length/max", "rollout/staleness/mean")},
            "threads": result["threads"], "affinity": result["affinity"], "wall_s": result["wall_s"],
            **({"overlap": result["overlap"]} if "overlap" in result else {})}


def check_threads(config: Config, measured: dict[str, Any], cores: int, cpus: list[int]) -> None:
    """Fail when a worker ran other torch threads than the row claims, or may run on other cores than the run's."""
    for role, want in expected_threads(config, cores).items():
        got = measured["threads"].get(role)
        if got is None or any(threads != want for threads in got):
            raise RuntimeError(f"{config.label}: the {role} processes ran {got} torch threads, the row claims {want} "
                               f"(workers.json: {measured['threads']})")
    for role, ranks in measured["affinity"].items():
        if any(set(allowed) - set(cpus) for allowed in ranks):
            raise RuntimeError(f"{config.label}: the {role} processes may run on cores {ranks}, outside {cpus}")


def threads_cell(config: Config, measured: dict[str, Any]) -> str:
    """The threads the actor's and the rollout's processes ran, as measured: ``2`` or ``1+1``."""
    roles = ["actor", ROLLOUT_ROLE] if config.separate else ["actor"]
    return "+".join(str(measured["threads"][role][0]) for role in roles)


def pick_cpus(cores: int) -> list[int]:
    """The first ``cores`` cores this process may run on: every run is pinned to the same ones."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < cores:
        raise SystemExit(f"--cores {cores}: this process may run on {len(allowed)} cores only ({allowed})")
    return allowed[:cores]


def runnable(selected: list[Config], overrides_of: Any) -> list[Config]:
    """The configurations whose recipes validate; a partial one that does not is skipped, saying why."""
    keep = []
    for config in selected:
        errors = validation_errors(overrides_of(config))
        if not errors:
            keep.append(config)
        elif config.partial:
            print(f"SKIPPED {config.label}: its recipe does not validate, so partial rollouts cannot run here "
                  f"(no numbers are reported for it):\n  " + "\n  ".join(errors), flush=True)
        else:
            raise SystemExit(f"{config.label}: the recipe does not validate:\n  " + "\n  ".join(errors))
    return keep


def workload(args: argparse.Namespace) -> tuple[list[str], dict[str, int], int]:
    """The overrides every row shares (model, task, batch, steps, seed 0), the model's architecture, and the prompt's
    tokens: from ``--model-path`` (an SFT export: its own architecture and weights) or the inline model."""
    task, prompt_tokens = task_overrides(args.task, args.max_new_tokens)
    if args.model_path is not None:
        model = {key: value for key, value in json.loads((args.model_path / "config.json").read_text()).items()
                 if key in FULL_MODEL}
        architecture = [f"roles.actor.model.path={args.model_path}", f"{MODEL_KEY}=null"]
    else:
        model = with_positions(QUICK_MODEL if args.quick else FULL_MODEL, prompt_tokens + args.max_new_tokens)
        architecture = model_overrides(model)
    base = [*architecture, *task,
            f"trainer.batch_size={args.batch}", f"trainer.mini_batch_size={args.batch}", f"rollout.n={args.n}",
            *RUN_FILES, f"trainer.total_steps={args.steps}", "trainer.seed=0"]
    return base, model, prompt_tokens


def speed(args: argparse.Namespace) -> dict[str, Any] | None:
    """Alternate the selected configurations ``--rounds`` times, flipping the order each round."""
    base, model, prompt_tokens = workload(args)
    full_batch = args.batch * args.n
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from flops import model_parameters

    parameters = model_parameters({"config": {"model_type": "qwen2", **model}})
    cpus = pick_cpus(args.cores)
    print(f"model: qwen2 {model}, {parameters / 1e6:.2f}M parameters; task {args.task}, {args.batch} prompts x "
          f"{args.n} samples, prompt {prompt_tokens} + up to {args.max_new_tokens} new tokens; {args.steps} steps, "
          f"rates after {args.warmup} warm-up; every run on cores {cpus}", flush=True)

    def overrides_of(config: Config) -> list[str]:
        traced = args.trace and config.separate and config.staleness >= 1
        return [*base, *placement_overrides(config, args.cores, args.partial), f"trainer.trace={str(traced).lower()}"]

    selected = runnable(args.configs, overrides_of)
    if args.dry_run:
        for config in selected:
            print(f"{config.label}: validates; threads {expected_threads(config, args.cores)}; "
                  f"{' '.join(placement_overrides(config, args.cores, args.partial))}")
        return None
    rounds: list[dict[str, dict[str, Any]]] = []
    for round_index in range(args.rounds):
        order = selected if round_index % 2 == 0 else selected[::-1]
        measured = {}
        for config in order:
            run = summarize(run_config(overrides_of(config), cpus, args.timeout), config, args.warmup, full_batch)
            check_threads(config, run, args.cores, cpus)
            measured[config.key] = run
            print(f"round {round_index + 1} {config.label}: {run['samples_per_s']:.3f} samples/s, "
                  f"{run['s_per_step']:.3f} s/step, threads {threads_cell(config, run)} (run {run['wall_s']:.0f} s)",
                  flush=True)
        rounds.append(measured)
    return {"model": model, "parameters": parameters, "task": args.task, "prompt_tokens": prompt_tokens,
            "new_tokens": args.max_new_tokens, "batch": args.batch, "n": args.n, "steps": args.steps,
            "warmup": args.warmup, "cores": cpus, "partial_tokens": args.partial,
            "configs": {c.key: c.label for c in selected}, "rounds": rounds}


def cell(value: float, width: int, digits: int = 3) -> str:
    """A number right-aligned in ``width`` ("-" where the run had no such phase)."""
    return f"{'-' if value != value else f'{value:.{digits}f}':>{width}}"


def print_speed(report: dict[str, Any], all_configs: dict[str, Config]) -> None:
    """The table: samples/s per round, their median, ratio vs (a), s/step and phase medians, threads."""
    rounds = report["rounds"]
    keys = list(report["configs"])
    rate = {key: statistics.median(r[key]["samples_per_s"] for r in rounds) for key in keys}
    cells = "".join(f"{f'r{i + 1} smp/s':>10}" for i in range(len(rounds)))
    print(f"\n{'config':<26}{cells}{'smp/s':>8}{'vs (a)':>8}{'s/step':>8}{'trained':>9}{'generate':>10}"
          f"{'update':>8}{'w.sync':>8}{'resp len':>10}{'threads':>9}")
    for key in keys:
        config, runs = all_configs[key], [r[key] for r in rounds]
        ratio = rate[key] / rate["a"] if "a" in rate else float("nan")
        phases = [statistics.median(run[k] for run in runs)
                  for k in ("time/generate", "time/update_actor", "time/weight_sync", "response_length/mean")]
        trained = statistics.median(statistics.mean(run["trained_samples"]) for run in runs)
        per_round = "".join(f"{run['samples_per_s']:>10.3f}" for run in runs)
        print(f"{config.label:<26}{per_round}{rate[key]:>8.3f}{cell(ratio, 8, 2)}"
              f"{statistics.median(run['s_per_step'] for run in runs):>8.2f}{trained:>9.1f}"
              f"{cell(phases[0], 10)}{cell(phases[1], 8)}{cell(phases[2], 8)}{cell(phases[3], 10, 1)}"
              f"{threads_cell(config, runs[0]):>9}")
    print(f"smp/s: trained samples after the warm-up / wall-clock between the step records (median over rounds); "
          f"vs (a): that rate over (a)'s; s/step: median gap between step records; trained: mean trained samples "
          f"per step; phases: medians of time/*; threads: torch threads of the actor's (+ rollout's) process as "
          f"the workers reported them; every run on cores {report['cores']}")
    for index, measured in enumerate(rounds):
        for key, run in measured.items():
            if "overlap" in run:
                o = run["overlap"]
                share = o["overlap_s"] / o["update_s"] if o["update_s"] else float("nan")
                print(f"round {index + 1} {all_configs[key].label}: rollout.generate_sequences overlaps "
                      f"actor.update_actor for {o['overlap_s']:.2f} s ({share:.0%} of {o['update_s']:.2f} s of "
                      f"updates, {o['generate_s']:.2f} s of generation)")


def final_reward(records: list[dict[str, Any]]) -> float:
    """Mean reward/mean of the last REWARD_WINDOW steps."""
    return statistics.mean(r["reward/mean"] for r in records[-REWARD_WINDOW:])


def reward(args: argparse.Namespace) -> dict[str, Any]:
    """The quickstart as shipped, separate at k=0 and k=1, per seed; the final rewards and their difference."""
    cpus, by_key = pick_cpus(args.cores), configs(1)
    rows = []
    for index, seed in enumerate(args.seeds):
        order = [by_key["b"], by_key["c"]] if index % 2 == 0 else [by_key["c"], by_key["b"]]
        finals = {}
        for config in order:
            steps = [f"trainer.total_steps={args.steps}"] if args.steps else []
            overrides = [*placement_overrides(config, args.cores), *RUN_FILES, *steps, f"trainer.seed={seed}"]
            result = run_config(overrides, cpus, args.timeout)
            finals[config.staleness] = final_reward(result["records"])
            print(f"seed {seed} k={config.staleness}: final reward {finals[config.staleness]:.4f} "
                  f"({len(result['records'])} steps, run {result['wall_s']:.0f} s)", flush=True)
        relative = abs(finals[1] - finals[0]) / abs(finals[0]) if finals[0] else float("inf")
        rows.append({"seed": seed, "k0": finals[0], "k1": finals[1], "relative_diff": relative})
    print(f"\n{'seed':>5}{'k=0':>9}{'k=1':>9}{'rel. diff':>11}  within {REWARD_TARGET:.0%}")
    for row in rows:
        print(f"{row['seed']:>5}{row['k0']:>9.4f}{row['k1']:>9.4f}{row['relative_diff']:>11.1%}  "
              f"{'yes' if row['relative_diff'] <= REWARD_TARGET else 'no'}")
    print(f"final reward: mean reward/mean over the last {REWARD_WINDOW} steps (or all, if fewer) "
          f"of recipes/quickstart.yaml, {args.steps or 'its own'} steps, separate placement on cores {cpus}")
    return {"rows": rows, "window": REWARD_WINDOW, "target": REWARD_TARGET}


def parse_args() -> argparse.Namespace:
    """The command line, with the --quick defaults filled in and the configurations picked."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=None, help="alternations of the configs (default 3; 1 with --quick)")
    parser.add_argument("--steps", type=int, default=None,
                        help="steps per run, warm-up included (default 8; 3 with --quick; --reward: the recipe's 40)")
    parser.add_argument("--warmup", type=int, default=None, help="steps left out of the rates (default 2; 1 with --quick)")
    parser.add_argument("--quick", action="store_true", help="smoke test: hidden 64, 2 layers, 16 new tokens, 3 steps")
    parser.add_argument("--task", default="digits", help="bundled task, e.g. 'repeat?max_len=256&alpha=1.2' (default digits)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="rollout.max_new_tokens (default 256; 16 with --quick)")
    parser.add_argument("--batch", type=int, default=8, help="prompts per step, trainer.batch_size (default 8)")
    parser.add_argument("--n", type=int, default=4, help="samples per prompt, rollout.n (default 4)")
    parser.add_argument("--cores", type=int, default=2,
                        help="cores of every run: colocated gets one process of this many threads, separate two of half (default 2)")
    parser.add_argument("--configs", default=None,
                        help="comma-separated keys among a,b,c,d,p-co,p-sep (default a,c; a,c,p-co,p-sep with --partial)")
    parser.add_argument("--partial", type=int, default=None, metavar="TOKENS",
                        help="add the partial-rollout rows with rollout.partial.max_tokens_per_step=TOKENS")
    parser.add_argument("--partial-staleness", type=int, default=4,
                        help="trainer.max_staleness of the partial rows (default 4: a 256-token response in 64-token steps)")
    parser.add_argument("--model-path", type=Path, default=None,
                        help="start every run from this HF model directory (an SFT export: a policy whose responses end) "
                             "instead of the random inline 33.68M model")
    parser.add_argument("--trace", action="store_true", help="trace the separate k>=1 runs and report the generate/update overlap")
    parser.add_argument("--reward", action="store_true", help="final reward of the quickstart at k=0 vs k=1 instead")
    parser.add_argument("--seeds", default="0", help="--reward: comma-separated trainer.seed values (default 0)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds one run may take (default 3600)")
    parser.add_argument("--json", type=Path, default=None, help="also save every measurement here")
    parser.add_argument("--dry-run", action="store_true", help="validate every configuration and print it; trains nothing")
    parser.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return args
    if args.cores < 2 or args.cores % 2:
        parser.error("--cores must be even and at least 2: the separate rows split them between two processes")
    if args.partial is not None and (args.partial < 1 or args.partial_staleness < 1):
        parser.error("--partial needs a token budget >= 1 and --partial-staleness >= 1 (partial rollouts run ahead)")
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.warmup = (1 if args.quick else 2) if args.warmup is None else args.warmup
    args.max_new_tokens = args.max_new_tokens or (16 if args.quick else 256)
    if args.reward:  # the recipe's own 40 steps unless --steps or --quick says otherwise
        args.steps = args.steps or (3 if args.quick else None)
    else:
        args.steps = args.steps or (3 if args.quick else 8)
        if args.warmup < 1 or args.steps <= args.warmup or args.rounds < 1:
            parser.error("--warmup must be at least 1, --steps exceed it, and --rounds be at least 1")
    args.all_configs = configs(args.partial_staleness)
    keys = (args.configs or ("a,c,p-co,p-sep" if args.partial is not None else "a,c")).split(",")
    unknown = [key for key in keys if key not in args.all_configs]
    if unknown:
        parser.error(f"--configs: unknown {unknown}; known: {', '.join(args.all_configs)}")
    args.configs = [args.all_configs[key] for key in keys]
    if any(c.partial for c in args.configs) and args.partial is None:
        parser.error("--configs p-co / p-sep need --partial TOKENS")
    args.seeds = [int(seed) for seed in args.seeds.split(",") if seed.strip()]
    return args


def main() -> None:
    """Run the child's one recipe, or the speed or reward comparison, and print its table."""
    args = parse_args()
    if args.child:
        child(args.child)
        return
    started = time.perf_counter()
    report = reward(args) if args.reward else speed(args)
    if report is None:  # --dry-run
        return
    if not args.reward:
        print_speed(report, args.all_configs)
    print(f"total wall time {time.perf_counter() - started:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
