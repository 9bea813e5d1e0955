"""Trained samples per second on the long-tail task: ours (synchronous, partial rollouts) against TRL's GRPOTrainer.

    python benchmarks/vs_trl_long_tail.py --trl-python /tmp/trl-venv/bin/python --model-path /tmp/sft33/model \\
        [--rounds 3] [--steps 24] [--warmup 4] [--rows a,p-co,p-co-bf16,trl,trl-bf16] [--json PATH] [--dry-run]

``vs_trl.py`` compares one step on random models whose answers never end, so no tail is there to cut. This script
times the workload partial rollouts are for: the ``repeat`` task (answer lengths Pareto-distributed up to 256 digits)
from a trained start (``--model-path``, the SFT export ``docs/performance.md`` builds), 8 prompts x 4 samples, up to
256 new tokens, the quickstart's GRPO with its k3 KL loss (TRL: ``beta=0.001``, also a reference forward), lr 1e-3.

The rows, each a fresh process pinned to the same ``--cores`` cores with that many torch threads:

- ``a``: our synchronous colocated step (``async_step.py``'s (a));
- ``p-co``: our partial rollouts, colocated (``async_step.py``'s (p-co): ``--partial`` tokens a step,
  ``trainer.max_staleness`` ``--partial-staleness``, ``rollout.importance_cap: 2.0``);
- ``a-bf16`` and ``p-co-bf16``: the same, sampling in bf16 (``rollout.dtype``) with the actor computing in bf16
  (``roles.actor.model.dtype``, float32 master weights);
- ``trl`` and ``trl-bf16``: ``trl_grpo_baseline.py`` on the same model, task, prompts, reward and lengths, float32 and
  ``GRPOConfig(bf16=True)``.

The rate is trained samples per second after ``--warmup`` steps: for ours, ``async_step.py``'s (the trained samples of
the timed steps over the wall-clock between their records; a partial step trains the groups that finished); for TRL,
the full batch of each timed step over the sum of those steps' durations. Rows alternate round by round, the order
flipped each round. The table gives each row's rate against the faster TRL row, and where the time goes: seconds per
step, generation seconds per step, and the mean response length.
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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from async_step import (ROOT, check_threads, configs, pick_cpus, placement_overrides, run_config,  # noqa: E402
                        summarize, validation_errors, workload)
from vs_trl import BF16_ACTOR, BF16_ROLLOUT  # noqa: E402

TRL_BETA = "0.001"  # the quickstart's k3 KL loss coefficient: TRL also runs a reference forward then


@dataclass(frozen=True)
class Row:
    """One row: ours (an ``async_step.py`` configuration, plus overrides) or TRL (float32 or bf16)."""

    key: str
    label: str
    config: str | None = None
    extra: tuple[str, ...] = ()
    trl_bf16: bool = False

    @property
    def is_trl(self) -> bool:
        """Whether TRL runs this row."""
        return self.config is None


BF16 = (*BF16_ROLLOUT, *BF16_ACTOR)
ROWS = {row.key: row for row in [
    Row("a", "ours sync", "a"),
    Row("a-bf16", "ours sync bf16", "a", BF16),
    Row("p-co", "ours partial", "p-co"),
    Row("p-co-bf16", "ours partial bf16", "p-co", BF16),
    Row("trl", "TRL float32"),
    Row("trl-bf16", "TRL bf16", trl_bf16=True),
]}


def our_overrides(row: Row, args: argparse.Namespace, base: list[str]) -> list[str]:
    """The recipe overrides of one of our rows: the shared workload, its placement and partial budget, its dtypes."""
    config = configs(args.partial_staleness)[row.config]
    return [*base, *placement_overrides(config, args.cores, args.partial), *row.extra]


def trl_command(row: Row, args: argparse.Namespace, out: Path) -> list[str]:
    """``trl_grpo_baseline.py`` on the same model, task, lengths, steps and threads as our rows."""
    return [str(args.trl_python), str(HERE / "trl_grpo_baseline.py"), "--model-path", str(args.model_path),
            "--task", args.task, "--max-new-tokens", str(args.max_new_tokens), "--beta", TRL_BETA,
            "--steps", str(args.steps - args.warmup), "--warmup", str(args.warmup), "--threads", str(args.cores),
            "--json", str(out), *(["--bf16"] if row.trl_bf16 else [])]


def trl_rate(result: dict[str, Any], warmup: int, full_batch: int) -> dict[str, Any]:
    """TRL's trained samples/s after the warm-up (every step trains the full batch), its s/step and generation."""
    timed = result["all_step_seconds"][warmup:]
    if not timed:
        raise RuntimeError(f"TRL timed no step after {warmup} warm-up steps: {result['all_step_seconds']}")
    lengths = result.get("completion_chars", [])[warmup:]
    return {"samples_per_s": full_batch * len(timed) / sum(timed), "s_per_step": statistics.median(timed),
            "time/generate": statistics.median(result["all_generate_seconds"][warmup:]),
            "response_length/mean": statistics.mean(lengths) if lengths else float("nan"),
            "trained": float(full_batch), "threads": result["torch_threads"],
            "step_seconds": timed, "generate_seconds": result["all_generate_seconds"][warmup:], "lengths": lengths}


def run_trl(row: Row, args: argparse.Namespace, cpus: list[int]) -> dict[str, Any]:
    """One TRL run in its own virtualenv, pinned to ``cpus``."""
    with tempfile.TemporaryDirectory(prefix="vs_trl_long_tail_") as tmp:
        out = Path(tmp) / "trl.json"
        started = time.perf_counter()
        done = subprocess.run(trl_command(row, args, out), cwd=ROOT, capture_output=True, text=True,
                              timeout=args.timeout, preexec_fn=lambda: os.sched_setaffinity(0, cpus))
        if done.returncode != 0:
            raise RuntimeError(f"{row.label} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
        result = json.loads(out.read_text())
    measured = trl_rate(result, args.warmup, args.batch * args.n)
    if measured["threads"] != args.cores:
        raise RuntimeError(f"{row.label} ran {measured['threads']} torch threads, the row claims {args.cores}")
    return {**measured, "wall_s": time.perf_counter() - started, "load_avg_after": result.get("load_avg_after")}


def run_ours(row: Row, args: argparse.Namespace, base: list[str], cpus: list[int]) -> dict[str, Any]:
    """One of our runs (``async_step.py``'s child process), rated and checked as that script does."""
    config = configs(args.partial_staleness)[row.config]
    run = summarize(run_config(our_overrides(row, args, base), cpus, args.timeout), config, args.warmup,
                    args.batch * args.n)
    check_threads(config, run, args.cores, cpus)
    return {**run, "trained": statistics.mean(run["trained_samples"])}


def print_table(rows: list[Row], rounds: list[dict[str, dict[str, Any]]]) -> None:
    """Per row: the rate each round, its median, against the faster TRL row and our synchronous one, and phases."""
    rate = {row.key: statistics.median(r[row.key]["samples_per_s"] for r in rounds) for row in rows}
    trl = max((rate[row.key] for row in rows if row.is_trl), default=float("nan"))
    cells = "".join(f"{f'r{i + 1} smp/s':>10}" for i in range(len(rounds)))
    print(f"\n{'row':<20}{cells}{'smp/s':>8}{'vs TRL':>8}{'s/step':>8}{'trained':>9}{'generate':>10}{'resp len':>10}")
    for row in rows:
        runs = [r[row.key] for r in rounds]

        def median(key: str, runs: list[dict[str, Any]] = runs) -> float:
            return statistics.median(run[key] for run in runs)

        per_round = "".join(f"{run['samples_per_s']:>10.3f}" for run in runs)
        print(f"{row.label:<20}{per_round}{rate[row.key]:>8.3f}{rate[row.key] / trl:>8.2f}{median('s_per_step'):>8.2f}"
              f"{median('trained'):>9.1f}{median('time/generate'):>10.3f}{median('response_length/mean'):>10.1f}")
    print("smp/s: trained samples per second after the warm-up (median over rounds); vs TRL: over the faster TRL "
          "row's; trained: samples a step trained; generate: seconds a step generated; resp len: mean response "
          "tokens (TRL: characters of the decoded completions, the character tokenizer's tokens less the EOS)")


def parse_args() -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trl-python", type=Path, required=True, help="python of a virtualenv with trl")
    parser.add_argument("--model-path", type=Path, required=True, help="the start model, an SFT export")
    parser.add_argument("--task", default="repeat?max_len=256&alpha=1.2")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--rows", default="a,p-co,p-co-bf16,trl,trl-bf16", help=f"comma-separated: {', '.join(ROWS)}")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=24, help="steps per run, warm-up included (default 24)")
    parser.add_argument("--warmup", type=int, default=4, help="steps left out of the rates (default 4)")
    parser.add_argument("--partial", type=int, default=32, help="rollout.partial.max_tokens_per_step (default 32)")
    parser.add_argument("--partial-staleness", type=int, default=8, help="trainer.max_staleness of partial rows")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=1800, help="seconds one run may take (default 1800)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--dry-run", action="store_true", help="validate our rows and print both commands; time nothing")
    args = parser.parse_args()
    unknown = [key for key in args.rows.split(",") if key not in ROWS]
    if unknown:
        parser.error(f"--rows: unknown {unknown}; known: {', '.join(ROWS)}")
    if args.warmup < 1 or args.steps <= args.warmup:
        parser.error("--warmup must be at least 1 and --steps exceed it")
    args.rows, args.quick = [ROWS[key] for key in args.rows.split(",")], False  # workload() reads args.quick
    return args


def main() -> None:
    """Alternate the rows ``--rounds`` times and print the table."""
    args = parse_args()
    base, model, prompt_tokens = workload(args)
    cpus = pick_cpus(args.cores)
    print(f"model {args.model_path} ({model}); task {args.task}, {args.batch} x {args.n}, prompt {prompt_tokens} + up "
          f"to {args.max_new_tokens} tokens; {args.steps} steps, rates after {args.warmup}; cores {cpus}", flush=True)
    for row in args.rows:
        if row.is_trl:
            print(f"{row.label}: {' '.join(trl_command(row, args, Path('OUT.json')))}")
            continue
        errors = validation_errors(our_overrides(row, args, base))
        if errors:
            raise SystemExit(f"{row.label}: the recipe does not validate:\n  " + "\n  ".join(errors))
        print(f"{row.label}: validates; {' '.join(our_overrides(row, args, base)[len(base):])}")
    if args.dry_run:
        return
    rounds: list[dict[str, dict[str, Any]]] = []
    for index in range(args.rounds):
        measured = {}
        for row in args.rows if index % 2 == 0 else args.rows[::-1]:
            run = run_trl(row, args, cpus) if row.is_trl else run_ours(row, args, base, cpus)
            measured[row.key] = run
            print(f"round {index + 1} {row.label}: {run['samples_per_s']:.3f} samples/s, {run['s_per_step']:.3f} s/step "
                  f"(run {run['wall_s']:.0f} s)", flush=True)
        rounds.append(measured)
    print_table(args.rows, rounds)
    if args.json:
        args.json.write_text(json.dumps({"model": model, "task": args.task, "cores": cpus, "rounds": rounds}, indent=1))


if __name__ == "__main__":
    main()
