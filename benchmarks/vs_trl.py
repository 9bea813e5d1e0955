"""Our GRPO step against TRL's GRPOTrainer, side by side: the two alternate, round after round, in one run.

    python benchmarks/vs_trl.py --trl-python /tmp/trl-venv/bin/python [--rounds 3] [--sizes tiny,small]
                                [--algorithms kl,no-kl] [--steps 8] [--json PATH]

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
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from flops import percent

HERE = Path(__file__).resolve().parent
ALGORITHMS = {"kl": {"beta": "0.001", "ours": []}, "no-kl": {"beta": "0.0", "ours": ["--no-kl"]}}
SIZES = ("tiny", "small")


def _run_json(command: list[str], what: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        done = subprocess.run([*command, "--json", str(out)], capture_output=True, text=True, timeout=900)
        if done.returncode != 0 or not out.exists():
            tail = "\n".join((done.stdout + done.stderr).splitlines()[-15:])
            raise SystemExit(f"{what} failed (exit {done.returncode}):\n{tail}")
        return json.loads(out.read_text())


def trl_step(trl_python: str, size: str, beta: str, steps: int) -> dict:
    """Median s/step and generate time of TRL's GRPOTrainer (one fresh process)."""
    result = _run_json([trl_python, str(HERE / "trl_grpo_baseline.py"), "--size", size, "--beta", beta,
                        "--steps", str(steps)], f"TRL baseline ({size}, beta={beta})")
    return {"s_per_step": result["median_s_per_step"], "generate": result["median_generate_s"]}


def our_step(size: str, flags: list[str], steps: int) -> dict:
    """Median s/step, generate time and model-FLOPs shares of train_step.py (one fresh process, its own private Ray)."""
    results = _run_json([sys.executable, str(HERE / "train_step.py"), "--sizes", size, "--steps", str(steps),
                         *flags], f"train_step.py ({size} {' '.join(flags)})")
    (result,) = results
    return {"s_per_step": result["s_per_step"], "generate": result["phases"].get("generate", 0.0),
            "mfu/generate": result["mfu/generate"], "mfu/update": result["mfu/update"]}


def phase_seconds(row: dict, side: str, phase: str) -> float:
    """One side's median seconds of sampling (``generate``) or of everything else in a step (``rest``)."""
    measured = row[side]
    return measured["generate"] if phase == "generate" else measured["s_per_step"] - measured["generate"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trl-python", required=True, help="python of a virtualenv with trl (benchmarks/README.md)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sizes", default="tiny,small")
    parser.add_argument("--algorithms", default="kl,no-kl")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per measurement (default 8)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    algorithms = [a.strip() for a in args.algorithms.split(",") if a.strip()]
    if bad := [s for s in sizes if s not in SIZES] + [a for a in algorithms if a not in ALGORITHMS]:
        parser.error(f"unknown size or algorithm {bad}; sizes: {list(SIZES)}, algorithms: {list(ALGORITHMS)}")

    rows = []
    for round_index in range(args.rounds):
        for size in sizes:
            for algorithm in algorithms:
                spec = ALGORITHMS[algorithm]
                sides = [("trl", lambda: trl_step(args.trl_python, size, spec["beta"], args.steps)),
                         ("ours", lambda: our_step(size, spec["ours"], args.steps))]
                if round_index % 2:
                    sides.reverse()
                measured = {name: run() for name, run in sides}
                row = {"round": round_index + 1, "size": size, "algorithm": algorithm, **measured,
                       "trl_over_ours": measured["trl"]["s_per_step"] / measured["ours"]["s_per_step"]}
                rows.append(row)
                print(f"round {row['round']}  {size:<5} {algorithm:<5}  TRL {measured['trl']['s_per_step']:.3f} "
                      f"(generate {measured['trl']['generate']:.3f})  ours {measured['ours']['s_per_step']:.3f} "
                      f"(generate {measured['ours']['generate']:.3f})  TRL/ours {row['trl_over_ours']:.2f}  ours' MFU "
                      f"generate {percent(measured['ours']['mfu/generate'])} update {percent(measured['ours']['mfu/update'])}",
                      flush=True)

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
            phases = ", ".join(f"{statistics.median(phase_seconds(r, 'trl', name) for r in mine):.3f} / "
                               f"{statistics.median(phase_seconds(r, 'ours', name) for r in mine):.3f}"
                               for name in ("generate", "rest"))
            print(f"| {size} | {algorithm} | {trl} | {ours} | {', '.join(f'{x:.2f}' for x in ratios)} | "
                  f"{statistics.median(ratios):.2f} | {phases} | {mfu} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
