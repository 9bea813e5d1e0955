"""Seconds per rollout of the sampling loop, with the fast decoding step and with transformers' step.

    python benchmarks/sampling.py [--rounds 10] [--sizes tiny,small] [--json results.json]

Samples 8 digits prompts x 4 samples x 32 new tokens (the batch of train_step.py) in this process
with the quickstart's model at both sizes, alternating ``RLHFCTL_FAST_DECODE=1`` and ``=0`` round
after round, and prints the median seconds of each and the median of the per-round ratios. The first
round of each size is a warm-up and is left out. It also checks that both sampled the same tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from rlhfctl.models.loading import load_causal_lm, load_tokenizer  # noqa: E402
from rlhfctl.tasks import digits  # noqa: E402
from rlhfctl.rollout.generation import SamplingParams, eos_token_ids, sample_responses  # noqa: E402

SIZES = {"tiny": (64, 2, 128), "small": (256, 4, 512)}  # hidden, layers, intermediate, as train_step.py
PARAMS = SamplingParams(n=4, max_new_tokens=32, temperature=1.0)


def model_and_prompts(size: str) -> tuple[torch.nn.Module, object, torch.Tensor, torch.Tensor]:
    hidden, layers, intermediate = SIZES[size]
    model_cfg = {"config": {"model_type": "qwen2", "hidden_size": hidden, "num_hidden_layers": layers,
                            "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": intermediate,
                            "max_position_embeddings": 128}}
    tokenizer = load_tokenizer(model_cfg)
    model = load_causal_lm(model_cfg, tokenizer, seed=0).eval()
    texts = [record["prompt"] for record in digits.make_prompts(8, seed=0)]
    encoded = tokenizer(texts, return_tensors="pt", padding=True)
    return model, tokenizer, encoded["input_ids"], encoded["attention_mask"]


def sample_once(model, tokenizer, ids, mask, fast: bool) -> tuple[float, torch.Tensor]:
    os.environ["RLHFCTL_FAST_DECODE"] = "1" if fast else "0"
    start = time.perf_counter()
    responses, _ = sample_responses(model, ids, mask, PARAMS, eos_ids=eos_token_ids(tokenizer, model),
                                    pad_id=tokenizer.pad_token_id, generator=torch.Generator().manual_seed(0),
                                    samples_per_prompt=PARAMS.n)
    return time.perf_counter() - start, responses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="timed rounds per size (default 10)")
    parser.add_argument("--sizes", default="tiny,small")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    rows = []
    for size in [s.strip() for s in args.sizes.split(",") if s.strip()]:
        if size not in SIZES:
            parser.error(f"unknown size {size!r}; choose from {sorted(SIZES)}")
        model, tokenizer, ids, mask = model_and_prompts(size)
        times: dict[bool, list[float]] = {True: [], False: []}
        same_tokens = True
        for round_ in range(args.rounds + 1):
            fast_s, fast_tokens = sample_once(model, tokenizer, ids, mask, fast=True)
            plain_s, plain_tokens = sample_once(model, tokenizer, ids, mask, fast=False)
            same_tokens = same_tokens and torch.equal(fast_tokens, plain_tokens)
            if round_:
                times[True].append(fast_s)
                times[False].append(plain_s)
        rows.append({"size": size, "transformers_s": statistics.median(times[False]),
                     "fast_s": statistics.median(times[True]),
                     "speedup": statistics.median(p / f for p, f in zip(times[False], times[True])),
                     "same_tokens": same_tokens, "samples": {"fast": times[True], "transformers": times[False]}})
    os.environ.pop("RLHFCTL_FAST_DECODE", None)
    print(f"sampling 8 prompts x {PARAMS.n} samples x {PARAMS.max_new_tokens} tokens, {torch.get_num_threads()} "
          f"torch threads, medians of {args.rounds} alternating rounds")
    print(f"{'size':8s} {'transformers s':>15s} {'fast s':>8s} {'speed-up':>9s}  same tokens")
    for row in rows:
        print(f"{row['size']:8s} {row['transformers_s']:15.3f} {row['fast_s']:8.3f} {row['speedup']:8.2f}x  {row['same_tokens']}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
