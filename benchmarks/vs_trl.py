"""Our GRPO step against TRL's GRPOTrainer, side by side: the two alternate, round after round, in one run.

    python benchmarks/vs_trl.py --trl-python /tmp/trl-venv/bin/python [--rounds 3] [--sizes tiny,small,33m]
                                [--algorithms kl,no-kl] [--steps 8] [--placement colocated|separate]
                                [--staleness K] [--bf16 [--bf16-actor]] [--timeout S] [--json PATH] [--dry-run]

Each comparison runs the same algorithm on both sides:

- ``kl``: the quickstart's GRPO with a k3 KL loss (coefficient 0.001) against a reference model, and TRL
  with ``beta=0.001``, which also runs a reference forward every step;
- ``no-kl``: GRPO without a reference (``train_step.py --no-kl``), and TRL with its default ``beta=0``.

Every measurement is a fresh process (``train_step.py`` or ``trl_grpo_baseline.py``, which runs in its
own virtualenv with ``trl``); within a round the two sides alternate and which goes first flips every
round, so the machine's drift hits both. The table shows each side's median seconds per step (after 2
warm-up steps) per round, and ``TRL / ours``: above 1 means our step is faster. It also splits each side's
step into sampling (``generate``) and the rest (reward, reference and log-prob passes, loss, backward,
optimizer step), so it shows which part a difference comes from.

``--placement separate --staleness 1`` times our best configuration on a CPU machine: the rollout on a
pool of its own generating the next batch while the actor updates. Its ``generate`` is then only the wait
for that batch, so the table leaves our split out and compares seconds per step only.

``--bf16`` compares the two in bf16: TRL with ``GRPOConfig(bf16=True)`` (accelerate's autocast over float32 weights,
generation included; ``trl_grpo_baseline.py --bf16``), ours sampling in bf16 (``rollout.dtype: bfloat16``) with
truncated importance sampling (``rollout.importance_cap: 2.0``) correcting the engine's gap to the float32 actor.
``--bf16-actor`` also computes our actor in bf16 (``roles.actor.model.dtype: bfloat16``, float32 master weights: the
like-for-like of TRL's autocast); the engine then matches the actor, so the cap stays only where the engine returns
log-probs of its own (``--placement separate``). Both sides' dry runs print the precision they will time.

Both sides get the machine's cores: TRL one process with that many torch threads (``--threads``), ours
one worker process with as many (colocated) or two with half each (separate), by the trainer's own rule.
Before timing anything, both sides describe what they would run (``--dry-run`` of each script) and the
run stops unless model, parameters, batch, response length and temperature agree; ``--dry-run`` here
stops after that check.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from functools import partial
from pathlib import Path

from flops import percent

HERE = Path(__file__).resolve().parent
ALGORITHMS = {"kl": {"beta": "0.001", "ours": []}, "no-kl": {"beta": "0.0", "ours": ["--no-kl"]}}
SIZES = ("tiny", "small", "33m")
# What both sides' --dry-run report and must agree on.
SAME = ("architecture", "parameters", "prompts", "n", "new_tokens", "temperature")
BF16_ROLLOUT = ["rollout.dtype=bfloat16"]
BF16_ACTOR = ["roles.actor.model.dtype=bfloat16"]
# Truncated IS, not masked: the bf16 gap is small and on every token, so weighing every token by min(ratio, 2)
# corrects it where a [0.5, 2] mask would leave nearly all tokens at weight 1 (benchmarks/rollout_precision.py).
BF16_CORRECTION = ["rollout.importance_cap=2.0"]


def our_precision(bf16: bool, bf16_actor: bool, placement: str) -> list[str]:
    """Our recipe overrides for ``--bf16`` / ``--bf16-actor``: a bf16 engine, the actor's compute dtype, and the
    correction wherever the engine returns log-probs of its own (a precision apart from the actor's, or a rollout
    group of its own); a colocated engine in the actor's precision has none, and validate says the cap does nothing."""
    if not bf16:
        return []
    own_engine_log_probs = not bf16_actor or placement == "separate"
    return [*BF16_ROLLOUT, *(BF16_ACTOR if bf16_actor else []), *(BF16_CORRECTION if own_engine_log_probs else [])]


def _run_json(command: list[str], what: str, timeout_s: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        done = subprocess.run([*command, "--json", str(out)], capture_output=True, text=True, timeout=timeout_s,
                              check=False)
        if done.returncode != 0 or not out.exists():
            tail = "\n".join((done.stdout + done.stderr).splitlines()[-15:])
            raise SystemExit(f"{what} failed (exit {done.returncode}):\n{tail}")
        return json.loads(out.read_text())


class Sides:
    """How to run each side: TRL's python and threads, our train_step.py flags, steps and the time limit."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.trl_python, self.steps, self.timeout_s = args.trl_python, args.steps, args.timeout
        self.threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        self.placement = ["--placement", args.placement, "--staleness", str(args.staleness)]
        self.bf16 = args.bf16
        self.precision = our_precision(args.bf16, args.bf16_actor, args.placement)

    def trl_command(self, size: str, beta: str) -> list[str]:
        return [self.trl_python, str(HERE / "trl_grpo_baseline.py"), "--size", size, "--beta", beta,
                "--steps", str(self.steps), "--threads", str(self.threads), *(["--bf16"] if self.bf16 else [])]

    def our_command(self, size: str, flags: list[str]) -> list[str]:
        return [sys.executable, str(HERE / "train_step.py"), "--sizes", size, "--steps", str(self.steps),
                *self.placement, *flags, *(["--set", *self.precision] if self.precision else [])]

    def trl_step(self, size: str, beta: str) -> dict:
        """Median s/step and generate time of TRL's GRPOTrainer (one fresh process)."""
        result = _run_json(self.trl_command(size, beta), f"TRL baseline ({size}, beta={beta})", self.timeout_s)
        return {"s_per_step": result["median_s_per_step"], "generate": result["median_generate_s"],
                "torch_threads": result["torch_threads"], "bf16": result.get("bf16", False),
                "output_dtypes": result.get("output_dtypes")}

    def our_step(self, size: str, flags: list[str]) -> dict:
        """Median s/step, generate time (the wait, at staleness >= 1), wall-clock per step and model-FLOPs
        shares of train_step.py (one fresh process, its own private Ray)."""
        (result,) = _run_json(self.our_command(size, flags), f"train_step.py ({size} {' '.join(flags)})", self.timeout_s)
        return {"s_per_step": result["s_per_step"], "generate": result["phases"].get("generate", 0.0),
                "window_s_per_step": result["window_s_per_step"], "max_staleness": result["max_staleness"],
                "workers": result["workers"], "mfu/generate": result["mfu/generate"], "mfu/update": result["mfu/update"],
                "actor_dtype": result["actor_dtype"], "rollout_dtype": result["rollout_dtype"],
                "corrections": result["corrections"]}

    def check_same_work(self, size: str, algorithm: str) -> str:
        """Both sides' --dry-run must describe the same model and batch; returns the threads each side gets."""
        spec = ALGORITHMS[algorithm]
        trl = _run_json([*self.trl_command(size, spec["beta"]), "--dry-run"], f"TRL dry run ({size})", self.timeout_s)
        (ours,) = _run_json([*self.our_command(size, spec["ours"]), "--dry-run"], f"train_step.py dry run ({size})",
                            self.timeout_s)
        if differ := {key: (trl[key], ours[key]) for key in SAME if trl[key] != ours[key]}:
            raise SystemExit(f"{size} {algorithm}: the two sides would not run the same work (TRL, ours): {differ}")
        workers = " + ".join(f"{w['processes']} x {w['threads']} ({pool})" for pool, w in ours["workers"].items())
        corrections = ", ".join(ours["corrections"]) or "no correction"
        return (f"{size} {algorithm}: {ours['parameters'] / 1e6:.2f}M parameters, {ours['prompts']} prompts x "
                f"{ours['n']}, <= {ours['new_tokens']} new tokens, temperature {ours['temperature']:g}; torch threads: "
                f"TRL 1 x {trl['torch_threads']}, ours {workers} (processes x threads); precision: TRL "
                f"{'bf16 autocast' if trl.get('bf16') else 'float32'}, ours actor {ours['actor_dtype']}, rollout "
                f"{ours['rollout_dtype']} ({corrections})")


def phase_cell(rows: list[dict], side: str, phase: str) -> str:
    """One side's median seconds of sampling (``generate``) or of the rest of a step; "-" for our step at
    staleness >= 1, whose ``generate`` is the wait for a batch generated during the previous step."""
    if side == "ours" and rows[0]["ours"]["max_staleness"] >= 1:
        return "-"
    seconds = [r[side]["generate"] if phase == "generate" else r[side]["s_per_step"] - r[side]["generate"] for r in rows]
    return f"{statistics.median(seconds):.3f}"


def measure_rounds(sides: Sides, rounds: int, sizes: list[str], algorithms: list[str]) -> list[dict]:
    """Every round, size and algorithm: both sides, the order flipped every round; one line each as it lands."""
    rows = []
    for round_index in range(rounds):
        for size in sizes:
            for algorithm in algorithms:
                spec = ALGORITHMS[algorithm]
                order = [("trl", partial(sides.trl_step, size, spec["beta"])),
                         ("ours", partial(sides.our_step, size, spec["ours"]))]
                if round_index % 2:
                    order.reverse()
                measured = {name: run() for name, run in order}
                row = {"round": round_index + 1, "size": size, "algorithm": algorithm, **measured,
                       "trl_over_ours": measured["trl"]["s_per_step"] / measured["ours"]["s_per_step"]}
                rows.append(row)
                trl, ours = measured["trl"], measured["ours"]
                ours_generate = "wait" if ours["max_staleness"] >= 1 else "generate"
                print(f"round {row['round']}  {size:<5} {algorithm:<5}  TRL {trl['s_per_step']:.3f} "
                      f"(generate {trl['generate']:.3f})  ours {ours['s_per_step']:.3f} (wall {ours['window_s_per_step']:.3f}, "
                      f"{ours_generate} {ours['generate']:.3f})  TRL/ours {row['trl_over_ours']:.2f}  ours' MFU "
                      f"generate {percent(ours['mfu/generate'])} update {percent(ours['mfu/update'])}", flush=True)
    return rows


def print_table(rows: list[dict], sizes: list[str], algorithms: list[str]) -> None:
    """The Markdown table: every round, the median ratio, the phase split and our MFU."""
    print()
    print("| size | algorithm | TRL s/step (rounds) | ours s/step (rounds) | TRL / ours (rounds) | median "
          "| TRL / ours: generate, rest (medians) | ours' MFU generate / update (median) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for size in sizes:
        for algorithm in algorithms:
            mine = [r for r in rows if r["size"] == size and r["algorithm"] == algorithm]
            trl = ", ".join(f"{r['trl']['s_per_step']:.3f}" for r in mine)
            ours = ", ".join(f"{r['ours']['s_per_step']:.3f}" for r in mine)
            ratios = [r["trl_over_ours"] for r in mine]
            mfu = " / ".join(percent(statistics.median(r["ours"][key] for r in mine)) for key in ("mfu/generate", "mfu/update"))
            phases = ", ".join(f"{phase_cell(mine, 'trl', name)} / {phase_cell(mine, 'ours', name)}"
                               for name in ("generate", "rest"))
            print(f"| {size} | {algorithm} | {trl} | {ours} | {', '.join(f'{x:.2f}' for x in ratios)} | "
                  f"{statistics.median(ratios):.2f} | {phases} | {mfu} |")
    if any(r["ours"]["max_staleness"] >= 1 for r in rows):
        print("\nours at max_staleness >= 1: the next batch is generated while the actor updates, so our step has no "
              "generate/rest split ('-'); s/step is time/step, the wait for that batch included")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trl-python", required=True, help="python of a virtualenv with trl (benchmarks/README.md)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sizes", default="tiny,small", help=f"comma-separated: {', '.join(SIZES)} (default tiny,small)")
    parser.add_argument("--algorithms", default="kl,no-kl")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per measurement (default 8)")
    parser.add_argument("--placement", choices=("colocated", "separate"), default="colocated",
                        help="our rollout: colocated with the actor (default) or on a pool of its own")
    parser.add_argument("--staleness", type=int, default=0,
                        help="our trainer.max_staleness (default 0; 1 with --placement separate: the best config)")
    parser.add_argument("--bf16", action="store_true",
                        help="TRL with bf16=True; ours with rollout.dtype=bfloat16 and rollout.importance_cap=2.0")
    parser.add_argument("--bf16-actor", action="store_true",
                        help="with --bf16: our actor computes in bf16 too (roles.actor.model.dtype=bfloat16)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds one measurement may take (default 3600)")
    parser.add_argument("--dry-run", action="store_true", help="check both sides would run the same work, time nothing")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    algorithms = [a.strip() for a in args.algorithms.split(",") if a.strip()]
    if bad := [s for s in sizes if s not in SIZES] + [a for a in algorithms if a not in ALGORITHMS]:
        parser.error(f"unknown size or algorithm {bad}; sizes: {list(SIZES)}, algorithms: {list(ALGORITHMS)}")
    if args.rounds < 1 or args.steps < 1:
        parser.error("--rounds and --steps must be at least 1")
    if args.bf16_actor and not args.bf16:
        parser.error("--bf16-actor goes with --bf16 (TRL's side is bf16 only then)")
    sides = Sides(args)
    print(f"ours: rollout {args.placement}, max_staleness {args.staleness}"
          f"{'; ' + ' '.join(sides.precision) if sides.precision else ''}; TRL bf16={args.bf16}; "
          f"{args.steps} timed steps after 2 warm-up", flush=True)
    for size in sizes:
        for algorithm in algorithms:
            print(sides.check_same_work(size, algorithm), flush=True)
    if args.dry_run:
        return
    rows = measure_rounds(sides, args.rounds, sizes, algorithms)
    print_table(rows, sizes, algorithms)
    if args.json:
        args.json.write_text(json.dumps({"placement": args.placement, "max_staleness": args.staleness,
                                         "bf16": args.bf16, "ours_precision": sides.precision,
                                         "threads": sides.threads, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
