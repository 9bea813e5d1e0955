"""The actor's update phase, padded against padding-free, on a batch whose responses range from 8 to 256 tokens.

    python benchmarks/packing.py [--rows 32] [--rounds 3] [--hidden 256] [--layers 4] [--json out.json]

One ``update_actor`` call (forward, PPO loss, backward, AdamW step) on the same batch, in this process:

- ``padded``: ``padding_free: false``, micro-batches of ``--micro`` rows;
- ``padding-free``: the same micro-batches packed into one row each;
- ``padding-free + budget``: packed micro-batches formed by ``micro_batch_tokens`` (the padded
  micro-batch's width x rows, so the same memory bound).

The variants alternate ``--rounds`` times (the order rotating each round) and the table shows medians.
Achieved FLOP/s counts 6 x parameters x real tokens per update (the useful work; the padded pass also
computes ``6 x parameters x padded tokens``), as a share of a float32 matmul peak measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from flops import UPDATE_FLOPS_PER_PARAM_TOKEN, matmul_peak
from rlhfctl.protocol import DataProto
from rlhfctl.single_controller import ClassWithInitArgs, LocalWorkerGroup
from workers import ActorWorker

PROMPT = 32
RESPONSES = (8, 256)


def mixed_batch(rows: int, vocab: int, seed: int = 0) -> DataProto:
    """Left-padded prompts (16..32 tokens) and right-padded responses of 8..256 tokens, evenly spread."""
    generator = torch.Generator().manual_seed(seed)
    width = RESPONSES[1]
    ids = torch.randint(4, vocab, (rows, PROMPT + width), generator=generator)
    mask = torch.zeros_like(ids)
    lengths = torch.linspace(RESPONSES[0], RESPONSES[1], rows).round().long()
    lengths = lengths[torch.randperm(rows, generator=generator)]
    for row in range(rows):
        prompt = int(torch.randint(16, PROMPT + 1, (1,), generator=generator))
        mask[row, PROMPT - prompt : PROMPT + int(lengths[row])] = 1
    advantages = torch.randn(rows, 1, generator=generator).expand(rows, width) * mask[:, PROMPT:]
    return DataProto.from_dict({"input_ids": ids * mask, "attention_mask": mask, "responses": (ids * mask)[:, PROMPT:],
                                "response_mask": mask[:, PROMPT:], "advantages": advantages.contiguous()})


def recipe(args: argparse.Namespace, actor: dict) -> dict:
    """A one-rank actor recipe: inline qwen2 at the chosen size, one mini-batch, tiny learning rate."""
    config = {"model_type": "qwen2", "hidden_size": args.hidden, "num_hidden_layers": args.layers,
              "num_attention_heads": args.hidden // 64, "intermediate_size": 4 * args.hidden,
              "max_position_embeddings": 512}
    return {"trainer": {"seed": 0, "total_steps": 100, "ppo_epochs": 1, "batch_size": args.rows, "mini_batch_size": args.rows},
            "rollout": {"n": 1, "max_new_tokens": RESPONSES[1]}, "resource_pools": {"global": {"use_gpu": False}},
            "roles": {"actor": {"model": {"config": config}, "optim": {"lr": 1e-7}, **actor}}}


VARIANTS = {
    "padded": lambda args: {"padding_free": False, "micro_batch_size": args.micro},
    "padding-free": lambda args: {"padding_free": True, "micro_batch_size": args.micro},
    "padding-free + budget": lambda args: {"padding_free": True, "micro_batch_tokens": args.micro * (PROMPT + RESPONSES[1])},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=32, help="samples in the update batch (default 32)")
    parser.add_argument("--micro", type=int, default=8, help="rows per padded micro-batch (default 8)")
    parser.add_argument("--rounds", type=int, default=3, help="alternations of the variants (default 3)")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    groups = {name: LocalWorkerGroup(1, ClassWithInitArgs(ActorWorker, recipe(args, make(args)), "actor"), role="actor")
              for name, make in VARIANTS.items()}
    try:
        for group in groups.values():
            group.init_model()
        module = groups["padded"].workers[0].module
        params = sum(parameter.numel() for parameter in module.parameters())
        batch = mixed_batch(args.rows, module.config.vocab_size)
        real = int(batch.batch["attention_mask"].sum())
        padded = batch.batch["attention_mask"].numel()
        for group in groups.values():  # warm-up
            group.update_actor(batch)
        seconds: dict[str, list[float]] = {name: [] for name in groups}
        peaks = []
        for round_index in range(args.rounds):
            names = list(groups)
            names = names[round_index % len(names):] + names[: round_index % len(names)]
            peaks.append(matmul_peak())
            for name in names:
                start = time.perf_counter()
                groups[name].update_actor(batch)
                seconds[name].append(time.perf_counter() - start)
    finally:
        for group in groups.values():
            group.shutdown()
    peak = statistics.median(peaks)
    useful = UPDATE_FLOPS_PER_PARAM_TOKEN * params * real
    print(f"{params / 1e6:.1f}M parameters (hidden {args.hidden} x {args.layers}); {args.rows} rows, prompts 16-{PROMPT}, "
          f"responses {RESPONSES[0]}-{RESPONSES[1]} tokens: {real} real of {padded} padded positions "
          f"({100 * real / padded:.0f}%); matmul peak {peak / 1e9:.0f} GFLOP/s on {torch.get_num_threads()} threads")
    print(f"{'variant':<24}{'s/update':>10}{'vs padded':>11}{'useful GFLOP/s':>16}{'share of peak':>15}")
    base = statistics.median(seconds["padded"])
    results = []
    for name, times in seconds.items():
        median = statistics.median(times)
        results.append({"variant": name, "s_per_update": median, "all_seconds": times, "speedup": base / median,
                        "useful_flops_per_s": useful / median, "share_of_peak": useful / median / peak})
        print(f"{name:<24}{median:>10.3f}{base / median:>10.2f}x{useful / median / 1e9:>16.1f}"
              f"{100 * useful / median / peak:>14.1f}%")
    print(f"padded pass executes 6 x params x {padded} tokens: {UPDATE_FLOPS_PER_PARAM_TOKEN * params * padded / base / 1e9:.1f} GFLOP/s "
          f"({100 * UPDATE_FLOPS_PER_PARAM_TOKEN * params * padded / base / peak:.1f}% of peak)")
    if args.json:
        args.json.write_text(json.dumps({"params": params, "real_tokens": real, "padded_tokens": padded,
                                         "peak_flops_per_s": peak, "results": results}, indent=1))


if __name__ == "__main__":
    main()
