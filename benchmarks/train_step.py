"""Seconds per GRPO step and tokens/s of the quickstart recipe at two model sizes, with the phase breakdown.

    python benchmarks/train_step.py [--steps 8] [--warmup 2] [--sizes tiny,small] [--no-kl]
                                    [--backend ray|local] [--json results.json]
                                    [--compare KEY=VALUE ... [--rounds 3]]

The sizes run one after the other, each on a fresh private local Ray; the first ``--warmup`` steps of
each (model build, warm-up) are left out, and the table shows medians over the rest, as the TRL baseline
does. The orchestration share comes from the dispatch trace, and so do the actor's generate and update
call times that the model-FLOPs utilization columns divide by (``benchmarks/flops.py``: 2 x params x
generated tokens and 6 x params x real tokens, over a float32 matmul peak measured in the same run).
``--no-kl`` drops the reference role and the KL loss, the algorithm TRL's GRPOTrainer runs with its
default ``beta=0``.

``--compare`` times the recipe as it is against the recipe with the given overrides (say
``roles.reward.pool=driver``), alternating the two ``--rounds`` times per size and swapping which goes
first each round, since this kind of machine drifts between runs. Each round prints both sides' total
step time, their ratio and both orchestration shares.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from omegaconf import OmegaConf

from flops import matmul_peak, model_parameters, percent, shares
from rlhfctl.recipe import load_recipe
from rlhfctl.trace import TRACE_FILE
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
        peak = matmul_peak()
        summary = run_training(cfg)
        records = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
        spans = actor_spans(Path(out) / TRACE_FILE, warmup)
    timed = records[warmup:] or records
    samples = cfg.trainer.batch_size * cfg.rollout.n
    generated = samples * statistics.median(r["response_length/mean"] for r in timed)
    real = generated + samples * statistics.median(r["prompt_length/mean"] for r in timed)
    parameters = model_parameters(OmegaConf.to_container(cfg.roles.actor.model, resolve=True))
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
        "parameters": parameters, "matmul_peak_flops": peak, "actor_span_s": spans,
        **shares(parameters, peak, update=(real, spans["update_actor"]), generate=(generated, spans["generate_sequences"])),
    }


def actor_spans(trace_path: Path, warmup: int) -> dict[str, float]:
    """Median seconds of the actor's generate and update calls on its ranks after the warm-up steps (the trace)."""
    events = json.loads(trace_path.read_text())["traceEvents"]
    steps = sorted((e for e in events if e.get("cat") == "step"), key=lambda e: e["ts"])
    after = steps[warmup - 1]["ts"] + steps[warmup - 1]["dur"] if 0 < warmup < len(steps) else 0
    spans = {}
    for method in ("generate_sequences", "update_actor"):
        durations = [e["dur"] / 1e6 for e in events
                     if e.get("cat") == "worker" and e["name"] == f"actor.{method}" and e["ts"] >= after]
        spans[method] = statistics.median(durations) if durations else float("nan")
    return spans


def compare(size: str, base: list[str], changed: list[str], rounds: int, steps: int, warmup: int) -> list[dict]:
    """Alternate the recipe with and without ``changed``; per round, both sides' step totals and shares."""
    rows = []
    for round_index in range(rounds):
        order = [("base", base), ("changed", [*base, *changed])]
        if round_index % 2:
            order.reverse()
        measured = {side: measure(size, overrides, steps, warmup) for side, overrides in order}
        totals = {side: sum(result["all_step_seconds"][warmup:]) for side, result in measured.items()}
        rows.append({"model": size, "round": round_index + 1, "base_s": totals["base"], "changed_s": totals["changed"],
                     "base_over_changed": totals["base"] / totals["changed"],
                     "base_orchestration": measured["base"]["orchestration_share"],
                     "changed_orchestration": measured["changed"]["orchestration_share"]})
    return rows


def print_comparison(rows: list[dict], changed: list[str], steps: int) -> None:
    """One line per round and a median ratio per size."""
    print(f"changed = {' '.join(changed)}; seconds summed over {steps} timed steps; ratio > 1: the change is faster")
    print(f"{'model':<18}{'round':>6}{'base s':>9}{'changed s':>11}{'ratio':>8}{'orch. base':>12}{'orch. changed':>15}")
    for row in rows:
        print(f"{row['model']:<18}{row['round']:>6}{row['base_s']:>9.2f}{row['changed_s']:>11.2f}"
              f"{row['base_over_changed']:>8.3f}{percent(row['base_orchestration']):>12}{percent(row['changed_orchestration']):>15}")
    for model in dict.fromkeys(row["model"] for row in rows):
        ratios = [row["base_over_changed"] for row in rows if row["model"] == model]
        print(f"{model}: median ratio {statistics.median(ratios):.3f} over {len(ratios)} rounds "
              f"(range {min(ratios):.3f}-{max(ratios):.3f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8, help="timed steps per size (default 8)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (default 2, as the TRL baseline)")
    parser.add_argument("--sizes", default="tiny,small", help="comma-separated: tiny, small (default both)")
    parser.add_argument("--no-kl", action="store_true", help="no reference role and no KL loss (TRL's beta=0)")
    parser.add_argument("--backend", choices=("ray", "local"), default="ray",
                        help="ray (default): the recipe's Ray workers; local: every role in this process")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--compare", nargs="+", metavar="KEY=VALUE", default=None,
                        help="time the recipe against the recipe with these overrides, alternating")
    parser.add_argument("--rounds", type=int, default=3, help="alternations per size with --compare (default 3)")
    args = parser.parse_args()
    picked = [size.strip() for size in args.sizes.split(",") if size.strip()]
    unknown = [size for size in picked if size not in SIZES]
    if unknown:
        parser.error(f"unknown size(s) {unknown}; choose from {sorted(SIZES)}")
    extra = [f"ray.backend={args.backend}", *(NO_KL if args.no_kl else [])]
    if args.compare:
        bad = [item for item in args.compare if "=" not in item]
        if bad or args.rounds < 1:
            parser.error(f"--compare takes KEY=VALUE overrides (got {bad}) and --rounds at least 1")
        rows = [row for size in picked for row in compare(SIZES[size]["label"], [*SIZES[size]["overrides"], *extra],
                                                           args.compare, args.rounds, args.steps, args.warmup)]
        print_comparison(rows, args.compare, args.steps)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))
        return
    results = [measure(SIZES[size]["label"], [*SIZES[size]["overrides"], *extra], args.steps, args.warmup)
               for size in picked]
    print(f"medians of {args.steps} steps after {args.warmup} warm-up; backend {args.backend}; "
          f"{'no KL (no reference)' if args.no_kl else 'KL loss with a reference, as the quickstart'}")
    phase_names = sorted({phase for result in results for phase in result["phases"]})
    header = (f"{'model':<18}{'s/step':>8}{'tok/s':>9}{'orch.':>7}{'MFU gen':>9}{'MFU upd':>9}  "
              + "  ".join(f"{p:>14}" for p in phase_names))
    print(header)
    for r in results:
        share = percent(r["orchestration_share"])
        cells = "  ".join(f"{r['phases'].get(p, 0.0):>14.3f}" for p in phase_names)
        print(f"{r['model']:<18}{r['s_per_step']:>8.3f}{r['tokens_per_s']:>9.0f}{share:>7}"
              f"{percent(r['mfu/generate']):>9}{percent(r['mfu/update']):>9}  {cells}")
    print(f"MFU: 2 x params x generated tokens / the actor's generate call, 6 x params x real tokens / its update "
          f"call (median rank spans), over a {results[0]['matmul_peak_flops'] / 1e9:.0f} GFLOP/s float32 matmul peak")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
