"""Seconds per GRPO step and tokens/s of the quickstart recipe at two model sizes, with the phase breakdown.

    python benchmarks/train_step.py [--steps 6] [--json results.json]

Both sizes run in one invocation, one after the other, on a private local Ray; the first step of each
(model build, warm-up) is left out of the means. The orchestration share comes from the dispatch trace.
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
    "tiny (h64 x2)": ["roles.actor.model.config.hidden_size=64", "roles.actor.model.config.num_hidden_layers=2",
                      "roles.actor.model.config.intermediate_size=128"],
    "small (h256 x4)": ["roles.actor.model.config.hidden_size=256", "roles.actor.model.config.num_hidden_layers=4",
                        "roles.actor.model.config.intermediate_size=512"],
}
# The batch TRL's GRPOTrainer was timed with on this kind of machine: 8 prompts x 4 samples, 32 new tokens.
BATCH = ["trainer.batch_size=8", "trainer.mini_batch_size=8", "rollout.n=4", "rollout.max_new_tokens=32",
         "rollout.temperature=1.0"]


def measure(name: str, overrides: list[str], steps: int) -> dict:
    """Run ``steps`` steps and read the per-step metrics and the trace summary back."""
    with tempfile.TemporaryDirectory() as out:
        cfg = load_recipe(RECIPE, [*overrides, *BATCH, f"trainer.total_steps={steps}", f"trainer.output_dir={out}",
                                   "trainer.trace=true", "trainer.val_every=0", "trainer.save_every=0"])
        summary = run_training(cfg)
        records = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    timed = records[1:] or records
    phases = sorted({key for record in timed for key in record if key.startswith("time/") and key != "time/step"})
    return {
        "model": name,
        "s_per_step": statistics.mean(r["time/step"] for r in timed),
        "tokens_per_s": statistics.mean(r["perf/tokens_per_s"] for r in timed),
        "phases": {phase.removeprefix("time/"): statistics.mean(r.get(phase, 0.0) for r in timed) for phase in phases},
        "orchestration_share": summary.get("trace", {}).get("orchestration_share"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    results = [measure(name, overrides, args.steps) for name, overrides in SIZES.items()]
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
