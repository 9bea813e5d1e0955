"""Seconds per GRPO step and tokens/s of the quickstart recipe at two model sizes, with the phase breakdown.

    python benchmarks/train_step.py [--steps 8] [--warmup 2] [--sizes tiny,small] [--no-kl]
                                    [--backend ray|local] [--json results.json]

The sizes run one after the other, each on a fresh private local Ray; the first ``--warmup`` steps of
each (model build, warm-up) are left out, and the table shows medians over the rest, as the TRL baseline
does. The orchestration share comes from the dispatch trace. ``--no-kl`` drops the reference role and
the KL loss, the algorithm TRL's GRPOTrainer runs with its default ``beta=0``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from rlhfctl.recipe import load_recipe
from rlhfctl.trainer import run_training

RECIPE = Path(__file__).resolve().parent.parent / "recipes" / "quickstart.yaml"

SIZES = {
    "tiny": {"label": "tiny (h64 x2)",
             "overrides": ["roles.actor.model.config.hidden_size=64", "roles.actor.model.config.num_hidden_layers=2",
                           "roles.actor.model.config.intermediate_size=128"]},
    "small": {"label": "small (h256 x4)",
              "overrides": ["roles.actor.model.config.hidden_size=256", "roles.actor.model.config.num_hidden_layers=4",
                            "roles.actor.model.config.intermediate_size=512"]},
}
# The batch TRL's GRPOTrainer was timed with on this kind of machine: 8 prompts x 4 samples, 32 new tokens.
BATCH = ["trainer.batch_size=8", "trainer.mini_batch_size=8", "rollout.n=4", "rollout.max_new_tokens=32",
         "rollout.temperature=1.0"]
# TRL's default GRPO (beta=0): no reference model, no KL term.
NO_KL = ["algorithm.kl.use_kl_loss=false", "roles.reference=null"]


def measure(name: str, overrides: list[str], steps: int, warmup: int = 2) -> dict:
    """Run ``warmup + steps`` steps and read the per-step metrics and the trace summary back."""
    with tempfile.TemporaryDirectory() as out:
        cfg = load_recipe(RECIPE, [*overrides, *BATCH, f"trainer.total_steps={warmup + steps}",
                                   f"trainer.output_dir={out}", "trainer.trace=true", "trainer.val_every=0",
                                   "trainer.save_every=0"])
        summary = run_training(cfg)
        records = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    timed = records[warmup:] or records
    phases = sorted({key for record in timed for key in record if key.startswith("time/") and key != "time/step"})
    step_seconds = [r["time/step"] for r in timed]
    return {
        "model": name,
        "s_per_step": statistics.median(step_seconds),
        "mean_s_per_step": statistics.mean(step_seconds),
        "min_s_per_step": min(step_seconds),
        "all_step_seconds": [r["time/step"] for r in records],
        "tokens_per_s": statistics.median(r["perf/tokens_per_s"] for r in timed),
        "phases": {phase.removeprefix("time/"): statistics.median(r.get(phase, 0.0) for r in timed) for phase in phases},
        "orchestration_share": summary.get("trace", {}).get("orchestration_share"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8, help="timed steps per size (default 8)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (default 2, as the TRL baseline)")
    parser.add_argument("--sizes", default="tiny,small", help="comma-separated: tiny, small (default both)")
    parser.add_argument("--no-kl", action="store_true", help="no reference role and no KL loss (TRL's beta=0)")
    parser.add_argument("--backend", choices=("ray", "local"), default="ray",
                        help="ray (default): the recipe's Ray workers; local: every role in this process")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    picked = [size.strip() for size in args.sizes.split(",") if size.strip()]
    unknown = [size for size in picked if size not in SIZES]
    if unknown:
        parser.error(f"unknown size(s) {unknown}; choose from {sorted(SIZES)}")
    extra = [f"ray.backend={args.backend}", *(NO_KL if args.no_kl else [])]
    results = [measure(SIZES[size]["label"], [*SIZES[size]["overrides"], *extra], args.steps, args.warmup)
               for size in picked]
    print(f"medians of {args.steps} steps after {args.warmup} warm-up; backend {args.backend}; "
          f"{'no KL (no reference)' if args.no_kl else 'KL loss with a reference, as the quickstart'}")
    phase_names = sorted({phase for result in results for phase in result["phases"]})
    header = f"{'model':<18}{'s/step':>8}{'tok/s':>9}{'orch.':>7}  " + "  ".join(f"{p:>14}" for p in phase_names)
    print(header)
    for r in results:
        share = f"{100 * r['orchestration_share']:.1f}%" if r["orchestration_share"] is not None else "-"
        cells = "  ".join(f"{r['phases'].get(p, 0.0):>14.3f}" for p in phase_names)
        print(f"{r['model']:<18}{r['s_per_step']:>8.3f}{r['tokens_per_s']:>9.0f}{share:>7}  {cells}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
