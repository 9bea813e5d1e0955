"""Seconds per GRPO step and tokens/s of the quickstart recipe at three model sizes, with the phase breakdown.

    python benchmarks/train_step.py [--steps 8] [--warmup 2] [--sizes tiny,small,33m] [--no-kl]
                                    [--placement colocated|separate] [--staleness K]
                                    [--backend ray|local] [--set KEY=VALUE ...] [--json results.json] [--dry-run]
                                    [--compare KEY=VALUE ... [--rounds 3]]

The sizes run one after the other, each on a fresh private local Ray; the first ``--warmup`` steps of
each (model build, warm-up) are left out, and the table shows medians over the rest, as the TRL baseline
does. The orchestration share comes from the dispatch trace, and so do the actor's generate and update
call times that the model-FLOPs utilization columns divide by (``benchmarks/flops.py``: 2 x params x
generated tokens and 6 x params x real tokens, over a float32 matmul peak measured in the same run).
``--no-kl`` drops the reference role and the KL loss, the algorithm TRL's GRPOTrainer runs with its
default ``beta=0``.

Every size is a full inline qwen2 architecture (the same one ``trl_grpo_baseline.py`` builds) with its
own response length. ``--placement separate`` runs the rollout on a pool of its own (``gen``, one
process) beside the ``main`` pool (actor, reference, reward), and ``--staleness K`` lets it run K batches
ahead (``trainer.max_staleness``). With K >= 1 ``time/generate`` is only the wait for a batch generated
during the previous step; ``time/step`` still covers the whole step, wait included, and
``window_s_per_step`` (the wall-clock from the first timed step's start to the last step's end, over the
timed steps, from the trace) checks it. ``--dry-run`` loads and validates each recipe and prints its
model, pools and threads without training.

``--set`` adds recipe overrides to every run (say ``rollout.dtype=bfloat16 rollout.importance_cap=2.0``: the
precision ``vs_trl.py --bf16`` times); the results and ``--dry-run`` name the actor's and the engine's dtypes.

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

from omegaconf import DictConfig, OmegaConf

from bench_sizes import SIZES
from flops import matmul_peak, model_parameters, percent, shares
from rlhfctl.recipe import load_recipe, present_roles, validate_recipe
from rlhfctl.recipe.off_policy import off_policy_corrections
from rlhfctl.recipe.resolve import ROLLOUT_ROLE, rollout_on_own_pool
from rlhfctl.recipe.resolved import resolve
from rlhfctl.trace import TRACE_FILE
from rlhfctl.trainer import run_training

RECIPE = Path(__file__).resolve().parent.parent / "recipes" / "quickstart.yaml"

MODEL_KEY = "roles.actor.model.config"
# The batch TRL's GRPOTrainer is timed with: 8 prompts x 4 samples, one optimizer step, temperature 1.
BATCH = ["trainer.batch_size=8", "trainer.mini_batch_size=8", "rollout.n=4", "rollout.temperature=1.0"]
# TRL's default GRPO (beta=0): no reference model, no KL term.
NO_KL = ["algorithm.kl.use_kl_loss=false", "roles.reference=null"]


def size_overrides(size: str) -> list[str]:
    """The size's inline qwen2 architecture and response length as recipe overrides."""
    spec = SIZES[size]
    return [*(f"{MODEL_KEY}.{key}={value}" for key, value in spec["model"].items()),
            f"rollout.max_new_tokens={spec['new_tokens']}"]


def placement_overrides(placement: str, staleness: int) -> list[str]:
    """Colocated: the quickstart's one pool. Separate: the rollout on a pool ``gen`` of one process, K ahead."""
    if placement == "colocated":
        return [f"trainer.max_staleness={staleness}"]
    return ["resource_pools.gen={process_on_nodes: [1], use_gpu: false}", "rollout.placement=separate",
            "rollout.pool=gen", f"trainer.max_staleness={staleness}"]


def worker_threads(cfg: DictConfig) -> dict[str, dict[str, int | None]]:
    """Worker processes of each pool in use and the torch threads each runs, by the trainer's own rule."""
    from rlhfctl.recipe.pools import DRIVER_POOL
    from rlhfctl.recipe.resolved import resolve
    from rlhfctl.trainer import role_groups

    recipe = resolve(cfg)
    pools = ({spec.pool for spec in recipe.roles.values()} | set(filter(None, [recipe.rollout.pool]))) - {DRIVER_POOL}
    return {pool: {"processes": int(recipe.resource_pools[pool].process_on_nodes[0]),
                   "threads": role_groups.cpu_threads_per_process(recipe, pool)} for pool in sorted(pools)}


def precision(cfg: DictConfig) -> dict[str, object]:
    """The actor's compute dtype, the engine's (``rollout.dtype`` as resolved) and the off-policy corrections set, so a
    result says which precision it timed."""
    resolved = resolve(cfg)
    return {"actor_dtype": str(cfg.roles.actor.model.dtype), "rollout_dtype": resolved.rollout.dtype,
            "corrections": off_policy_corrections(resolved)}


def recipe(overrides: list[str], steps: int, warmup: int, out: str) -> DictConfig:
    """The quickstart with ``overrides``, the batch and a traced run of ``warmup + steps`` steps into ``out``."""
    return load_recipe(RECIPE, [*overrides, *BATCH, f"trainer.total_steps={warmup + steps}", f"trainer.output_dir={out}",
                                "trainer.trace=true", "trainer.val_every=0", "trainer.save_every=0"])


def measure(name: str, overrides: list[str], steps: int, warmup: int = 2) -> dict:
    """Run ``warmup + steps`` steps and read the per-step metrics and the trace summary back."""
    with tempfile.TemporaryDirectory() as out:
        cfg = recipe(overrides, steps, warmup, out)
        peak = matmul_peak()
        summary = run_training(cfg)
        records = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
        generator = ROLLOUT_ROLE if rollout_on_own_pool(cfg.rollout) else "actor"
        spans, window = trace_spans(Path(out) / TRACE_FILE, warmup, generator)
    timed = records[warmup:] or records
    samples = cfg.trainer.batch_size * cfg.rollout.n
    generated = samples * statistics.median(r["response_length/mean"] for r in timed)
    real = generated + samples * statistics.median(r["prompt_length/mean"] for r in timed)
    parameters = model_parameters(OmegaConf.to_container(cfg.roles.actor.model, resolve=True))
    phases = sorted({key for record in timed for key in record if key.startswith("time/") and key != "time/step"})
    step_seconds = [r["time/step"] for r in timed]
    return {
        "model": name,
        "architecture": OmegaConf.to_container(cfg.roles.actor.model.config, resolve=True),
        "new_tokens": int(cfg.rollout.max_new_tokens), "temperature": float(cfg.rollout.temperature),
        "placement": str(cfg.rollout.placement), "max_staleness": int(cfg.trainer.max_staleness),
        "workers": worker_threads(cfg), **precision(cfg),
        "s_per_step": statistics.median(step_seconds),
        "mean_s_per_step": statistics.mean(step_seconds),
        "min_s_per_step": min(step_seconds),
        "window_s_per_step": window,
        "all_step_seconds": [r["time/step"] for r in records],
        "tokens_per_s": statistics.median(r["perf/tokens_per_s"] for r in timed),
        "phases": {phase.removeprefix("time/"): statistics.median(r.get(phase, 0.0) for r in timed) for phase in phases},
        "orchestration_share": summary.get("trace", {}).get("orchestration_share"),
        "parameters": parameters, "matmul_peak_flops": peak, "actor_span_s": spans,
        **shares(parameters, peak, update=(real, spans["update_actor"]), generate=(generated, spans["generate_sequences"])),
    }


def describe(name: str, overrides: list[str], steps: int, warmup: int) -> dict:
    """What ``measure`` would run, without running it: the validated recipe's model, batch, pools and threads."""
    with tempfile.TemporaryDirectory() as out:
        cfg = recipe(overrides, steps, warmup, out)
        report = validate_recipe(cfg)
    if report.errors:
        raise SystemExit(f"{name}: the recipe does not validate:\n" + "\n".join(str(issue) for issue in report.errors))
    return {"model": name, "architecture": OmegaConf.to_container(cfg.roles.actor.model.config, resolve=True),
            "parameters": model_parameters(OmegaConf.to_container(cfg.roles.actor.model, resolve=True)),
            "prompts": int(cfg.trainer.batch_size), "n": int(cfg.rollout.n), "new_tokens": int(cfg.rollout.max_new_tokens),
            "temperature": float(cfg.rollout.temperature), "placement": str(cfg.rollout.placement),
            "max_staleness": int(cfg.trainer.max_staleness), "workers": worker_threads(cfg), **precision(cfg),
            "steps": warmup + steps}


def trace_spans(trace_path: Path, warmup: int, generator: str) -> tuple[dict[str, float], float]:
    """Median seconds of the generate calls (``generator``'s ranks) and the actor's update calls after the
    warm-up steps, and the timed steps' wall-clock per step: last step's end - first timed step's start, over
    the timed steps (what a step waited for, and the driver's work between steps, included)."""
    events = json.loads(trace_path.read_text())["traceEvents"]
    steps = sorted((e for e in events if e.get("cat") == "step"), key=lambda e: e["ts"])
    after = steps[warmup - 1]["ts"] + steps[warmup - 1]["dur"] if 0 < warmup < len(steps) else 0
    timed = [e for e in steps if e["ts"] >= after] or steps
    window = (timed[-1]["ts"] + timed[-1]["dur"] - timed[0]["ts"]) / 1e6 / len(timed)
    spans = {}
    for method, role in (("generate_sequences", generator), ("update_actor", "actor")):
        durations = [e["dur"] / 1e6 for e in events
                     if e.get("cat") == "worker" and e["name"] == f"{role}.{method}" and e["ts"] >= after]
        spans[method] = statistics.median(durations) if durations else float("nan")
    return spans, window


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
    parser.add_argument("--sizes", default="tiny,small", help=f"comma-separated: {', '.join(SIZES)} (default tiny,small)")
    parser.add_argument("--no-kl", action="store_true", help="no reference role and no KL loss (TRL's beta=0)")
    parser.add_argument("--placement", choices=("colocated", "separate"), default="colocated",
                        help="colocated (default): one pool, one process; separate: the rollout on a pool 'gen' of its own")
    parser.add_argument("--staleness", type=int, default=0,
                        help="trainer.max_staleness: batches the rollout may run ahead (default 0; above 0 needs --placement separate)")
    parser.add_argument("--backend", choices=("ray", "local"), default="ray",
                        help="ray (default): the recipe's Ray workers; local: every role in this process")
    parser.add_argument("--set", nargs="+", metavar="KEY=VALUE", default=[], dest="overrides",
                        help="recipe overrides for every run (say rollout.dtype=bfloat16 rollout.importance_cap=2.0)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--dry-run", action="store_true", help="validate each size's recipe and print what would run")
    parser.add_argument("--compare", nargs="+", metavar="KEY=VALUE", default=None,
                        help="time the recipe against the recipe with these overrides, alternating")
    parser.add_argument("--rounds", type=int, default=3, help="alternations per size with --compare (default 3)")
    args = parser.parse_args()
    picked = [size.strip() for size in args.sizes.split(",") if size.strip()]
    unknown = [size for size in picked if size not in SIZES]
    if unknown:
        parser.error(f"unknown size(s) {unknown}; choose from {list(SIZES)}")
    if args.warmup < 1 or args.steps < 1:
        parser.error("--warmup and --steps must be at least 1")
    if bad := [item for item in args.overrides if "=" not in item]:
        parser.error(f"--set takes KEY=VALUE overrides, got {bad}")
    extra = [f"ray.backend={args.backend}", *(NO_KL if args.no_kl else []), *placement_overrides(args.placement, args.staleness),
             *args.overrides]
    runs = [(SIZES[size]["label"], [*size_overrides(size), *extra]) for size in picked]
    if args.dry_run:
        described = [describe(label, overrides, args.steps, args.warmup) for label, overrides in runs]
        for row in described:
            print(json.dumps(row))
        if args.json:
            args.json.write_text(json.dumps(described, indent=1))
        return
    if args.compare:
        bad = [item for item in args.compare if "=" not in item]
        if bad or args.rounds < 1:
            parser.error(f"--compare takes KEY=VALUE overrides (got {bad}) and --rounds at least 1")
        rows = [row for label, overrides in runs
                for row in compare(label, overrides, args.compare, args.rounds, args.steps, args.warmup)]
        print_comparison(rows, args.compare, args.steps)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))
        return
    results = [measure(label, overrides, args.steps, args.warmup) for label, overrides in runs]
    print(f"medians of {args.steps} steps after {args.warmup} warm-up; backend {args.backend}; "
          f"{'no KL (no reference)' if args.no_kl else 'KL loss with a reference, as the quickstart'}; "
          f"rollout {args.placement}, max_staleness {args.staleness}"
          f"{'; overrides ' + ' '.join(args.overrides) if args.overrides else ''}")
    print_results(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


def print_results(results: list[dict]) -> None:
    """One line per size: s/step, its wall-clock check, tok/s, orchestration, MFU, the phase medians, threads."""
    phase_names = sorted({phase for result in results for phase in result["phases"]})
    header = (f"{'model':<18}{'s/step':>8}{'wall':>8}{'tok/s':>9}{'orch.':>7}{'MFU gen':>9}{'MFU upd':>9}  "
              + "  ".join(f"{p:>14}" for p in phase_names) + "  workers (pool: processes x threads)")
    print(header)
    for r in results:
        share = percent(r["orchestration_share"])
        cells = "  ".join(f"{r['phases'].get(p, 0.0):>14.3f}" for p in phase_names)
        workers = ", ".join(f"{pool}: {w['processes']} x {w['threads']}" for pool, w in r["workers"].items())
        print(f"{r['model']:<18}{r['s_per_step']:>8.3f}{r['window_s_per_step']:>8.3f}{r['tokens_per_s']:>9.0f}{share:>7}"
              f"{percent(r['mfu/generate']):>9}{percent(r['mfu/update']):>9}  {cells}  {workers}")
    print("s/step: median time/step; wall: wall-clock per timed step (trace), the driver's work between steps included")
    if any(r["max_staleness"] >= 1 for r in results):
        print("max_staleness >= 1: 'generate' is the wait for a batch generated during the previous step, "
              "not the generation time (the rollout's own calls are in the MFU gen column)")
    print(f"MFU: 2 x params x generated tokens / the generating role's generate call, 6 x params x real tokens / the "
          f"actor's update call (median rank spans), over a {results[0]['matmul_peak_flops'] / 1e9:.0f} GFLOP/s "
          "float32 matmul peak measured in the driver")


if __name__ == "__main__":
    main()
