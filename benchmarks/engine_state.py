"""State per rank, DDP against FSDP2, at world size 2 on a ~100M-parameter qwen2 (CPU, gloo, real Ray).

    python benchmarks/engine_state.py [--layers 15] [--hidden 768] [--json results.json]

For each strategy: two ActorWorker ranks on a private local Ray build the model (inline config, random
weights, float32), take one PPO update on a fixed batch, and report the bytes each rank holds for
parameters, gradients (the trainable parameters' local size) and AdamW state (``state_bytes``), next to
the analytic count ``P x 4 B x (1 + 1 + 2) / shards``. Also timed: the update, and one rollout
(``generate_sequences``) where FSDP2 gathers the weights once for the whole call.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from flops import matmul_peak, model_parameters, percent, shares  # noqa: E402
from rlhfctl.protocol import DataProto  # noqa: E402
from rlhfctl.ray_cluster import start_or_join_ray  # noqa: E402
from rlhfctl.single_controller import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup  # noqa: E402
from workers import ActorWorker  # noqa: E402

ROWS, PROMPT, RESPONSE = 4, 16, 16
UPDATE_TOKENS = ROWS * 2 * (PROMPT + RESPONSE)  # the update batch's rows x width, every position real


def recipe(strategy: str, hidden: int, layers: int) -> dict:
    """The recipe dict of one side: the same model and batch, only the strategy differs."""
    config = {"model_type": "qwen2", "hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": 12,
              "num_key_value_heads": 12, "intermediate_size": hidden * 8 // 3, "max_position_embeddings": 256}
    return {
        "trainer": {"seed": 0, "total_steps": 10, "ppo_epochs": 1, "batch_size": ROWS},
        "rollout": {"n": 1, "max_new_tokens": RESPONSE, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "do_sample": True},
        "resource_pools": {"main": {"use_gpu": False}},
        "data": {"task": "digits"},
        "roles": {"actor": {"model": {"config": config}, "optim": {"lr": 1e-5}, "strategy": strategy},
                  "reward": {"function": "rlhfctl.tasks.digits:score"}},
    }


def update_batch() -> DataProto:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 60, (ROWS * 2, PROMPT + RESPONSE), generator=generator)
    return DataProto.from_dict({
        "input_ids": ids, "attention_mask": torch.ones_like(ids),
        "position_ids": torch.arange(PROMPT + RESPONSE).expand(ROWS * 2, -1).contiguous(),
        "responses": ids[:, PROMPT:], "response_mask": torch.ones_like(ids[:, PROMPT:]),
        "advantages": torch.randn(ROWS * 2, RESPONSE, generator=generator),
    })


def prompts() -> DataProto:
    ids = torch.randint(5, 60, (ROWS * 2, PROMPT), generator=torch.Generator().manual_seed(1))
    return DataProto.from_dict(tensors={"input_ids": ids, "attention_mask": torch.ones_like(ids)},
                               non_tensors={"uid": np.asarray([f"p{i}" for i in range(ROWS * 2)], dtype=object)})


def measure(strategy: str, hidden: int, layers: int) -> dict:
    """Build, update once, roll out once; the per-rank state and the timings of one side."""
    pool = RayResourcePool([2], name=f"bench-{strategy}")
    group = RayWorkerGroup(pool, RayClassWithInitArgs(ActorWorker, recipe(strategy, hidden, layers), "actor"), role="actor")
    try:
        started = time.perf_counter()
        group.init_model()
        build_s = time.perf_counter() - started
        started = time.perf_counter()
        group.update_actor(update_batch())
        update_s = time.perf_counter() - started
        sizes = group.state_bytes()
        started = time.perf_counter()
        rollout = group.generate_sequences(prompts())
        generate_s = time.perf_counter() - started
    finally:
        group.shutdown()
        pool.release()
    largest = max(sizes, key=lambda s: s["params"] + s["grads"] + s["optimizer"])
    return {"strategy": strategy, **largest, "total": largest["params"] + largest["grads"] + largest["optimizer"],
            "build_s": build_s, "update_s": update_s, "generate_s": generate_s,
            "generated_tokens": int(rollout.batch["response_mask"].sum())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--layers", type=int, default=15)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    count = model_parameters({"config": recipe("ddp", args.hidden, args.layers)["roles"]["actor"]["model"]["config"]})
    peak = matmul_peak()  # both ranks together share this machine's cores, as the peak's threads do
    session = start_or_join_ray(num_cpus=4, env_vars={"OMP_NUM_THREADS": "1"})
    try:
        rows = [measure(strategy, args.hidden, args.layers) for strategy in ("ddp", "fsdp2")]
    finally:
        session.shutdown()
    gib = 1 << 30
    print(f"model: qwen2 hidden {args.hidden} x {args.layers} layers, {count / 1e6:.1f}M parameters, float32, world 2")
    print(f"{'strategy':8s} {'params GiB':>10s} {'grads GiB':>10s} {'optim GiB':>10s} {'total GiB':>10s} "
          f"{'analytic':>9s} {'update s':>9s} {'rollout s':>9s} {'MFU upd':>8s} {'MFU gen':>8s}")
    for row in rows:
        shards = 2 if row["strategy"] == "fsdp2" else 1
        analytic = count * 4 * 4 / shards / gib
        row.update(shares(count, peak, update=(UPDATE_TOKENS, row["update_s"]), generate=(row["generated_tokens"], row["generate_s"])))
        print(f"{row['strategy']:8s} {row['params'] / gib:10.3f} {row['grads'] / gib:10.3f} {row['optimizer'] / gib:10.3f} "
              f"{row['total'] / gib:10.3f} {analytic:9.3f} {row['update_s']:9.2f} {row['generate_s']:9.2f} "
              f"{percent(row['mfu/update']):>8s} {percent(row['mfu/generate']):>8s}")
    ratio = rows[1]["total"] / rows[0]["total"]
    print(f"FSDP2 / DDP state per rank: {ratio:.3f}; MFU over a {peak / 1e9:.0f} GFLOP/s float32 matmul peak "
          "(first calls, set-up included)")
    if args.json:
        args.json.write_text(json.dumps({"parameters": count, "matmul_peak_flops": peak, "rows": rows, "ratio": ratio}, indent=1))


if __name__ == "__main__":
    main()
