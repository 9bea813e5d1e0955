"""On-policy distillation against GRPO: steps for a fresh student to reach 80% of its teacher's held-out score.

    python benchmarks/distillation.py [--output runs/bench-distillation] [--steps 60] [--share 0.8] [--json out.json]

1. ``rlhfctl pipeline recipes/distill-pipeline.yaml``: SFT makes the teacher (hidden 128, 3 layers) on the copy
   task's demonstrations, then a fresh student (the quickstart's hidden 64, 2 layers) distills from it
   (``algorithm.distillation``: coef 1, mix 0, whiten), validating every 2 steps on 32 held-out prompts, 4 sampled
   responses each (mean@4 at temperature 1: greedy answers saturate at once on this task).
2. GRPO from the same start: the distill stage's own recipe with ``roles.teacher`` null, so the same student
   weights (same seed), the same batch (16 prompts x n = 4), the same steps, reward and validation, and the
   same processes, cores and torch threads (one machine, run one after the other).
3. The teacher's held-out score: ``rlhfctl eval`` of the teacher's model with the distill stage's recipe, so the
   same prompts, the same mean@4 sampling and the same reward.

Reported: the teacher's score, each side's validation curve and the first validated step at which it reaches
``--share`` of the teacher's score (None: not within ``--steps``). A stage already complete is reused on a rerun.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RLHFCTL = [sys.executable, "-m", "rlhfctl.cli"]


def _run(*args: str) -> str:
    done = subprocess.run([*RLHFCTL, *args], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"rlhfctl {' '.join(args)} exited {done.returncode}:\n{done.stdout[-4000:]}{done.stderr[-4000:]}")
    return done.stdout


def validation_curve(run_dir: Path) -> list[tuple[int, float]]:
    """(step, val/reward/mean) of every validated step of a run."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(int(r["step"]), float(r["val/reward/mean"])) for r in records if "val/reward/mean" in r]


def first_reaching(curve: list[tuple[int, float]], target: float) -> int | None:
    """The first validated step whose score is at least ``target``."""
    return next((step for step, score in curve if score >= target), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", default="runs/bench-distillation")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--share", type=float, default=0.8)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    output = (ROOT / args.output).resolve()
    _run("pipeline", "recipes/distill-pipeline.yaml", f"output_dir={output}", f"distill.trainer.total_steps={args.steps}")
    distill_dir, grpo_dir = output / "distill", output / "grpo"
    if not (grpo_dir / "metrics.jsonl").exists() or len(validation_curve(grpo_dir)) < args.steps // 2:
        _run("train", str(distill_dir / "recipe.yaml"), "roles.teacher=null", f"trainer.output_dir={grpo_dir}",
             "trainer.export_hf=false")
    evaluated = json.loads(_run("eval", str(output / "teacher" / "model"), "--recipe", str(distill_dir / "recipe.yaml"),
                                "--format", "json"))
    teacher = float(_overall(evaluated))
    target = args.share * teacher
    result: dict[str, Any] = {"teacher_score": teacher, "target": target, "share": args.share}
    for name, run_dir in (("distillation", distill_dir), ("grpo", grpo_dir)):
        curve = validation_curve(run_dir)
        result[name] = {"curve": curve, "steps_to_target": first_reaching(curve, target)}
    print(f"teacher held-out score {teacher:.4f}; target {args.share:.0%} of it = {target:.4f}")
    print("| step | " + " | ".join(str(step) for step, _ in result["distillation"]["curve"]) + " |")
    print("|---|" + "---|" * len(result["distillation"]["curve"]))
    for name in ("distillation", "grpo"):
        print(f"| {name} | " + " | ".join(f"{score:.3f}" for _, score in result[name]["curve"]) + " |")
    for name in ("distillation", "grpo"):
        print(f"{name}: steps to {args.share:.0%} of the teacher: {result[name]['steps_to_target']}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


def _overall(evaluated: dict[str, Any]) -> float:
    """The all-prompts mean@n of ``rlhfctl eval --format json``."""
    return float(evaluated["sources"]["all"]["mean"])


if __name__ == "__main__":
    main()
