"""One short check of the CUDA path, for a machine with a GPU: run it once and read the table.

    python benchmarks/gpu_check.py [--steps 5] [--json results.json]

1. The fast decoding step (workers/sampling/fast_decode.py) against transformers' step on CUDA, in float32 and
   bfloat16: the largest logit difference and whether greedy sampling gives the same tokens.
2. Sampling time on CUDA with the fast step and without (``RLHFCTL_FAST_DECODE=0``), alternating.
3. The quickstart recipe trained for a few steps with ``resource_pools.main.use_gpu=true``, with
   ``ray.backend: local`` by default (a GPU box may have no Ray; ``--backend ray`` uses a private local
   Ray, where NCCL is picked for CUDA workers), and the reward it reached.
4. The training engine on a Qwen2.5-0.5B-shaped model (inline config, random weights, 494M parameters):
   FSDP2 at world 1, bf16 compute over float32 master weights, one rollout of 256-token responses and one
   PPO update; rollout and update tokens/s, ``torch.cuda.max_memory_allocated`` against the analytic
   state (``P x (4 + 4 + 8)`` bytes of float32 weights, gradients and AdamW state, plus the bf16 copy
   gathered for sampling) and against the memory plan ``rlhfctl validate`` shows for that recipe (state plus
   the rollout's KV cache), whether the float32 masters moved at lr 1e-6, and both phases' model-FLOPs
   utilization over a bf16 matmul peak measured in the same run (``benchmarks/flops.py``).

Exits 1 when a check fails, 2 when there is no CUDA device. Nothing is downloaded. About 3-5 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from flops import matmul_peak, shares  # noqa: E402

from rlhfctl.models.loading import load_causal_lm, load_tokenizer  # noqa: E402
from rlhfctl.recipe import load_recipe  # noqa: E402
from rlhfctl.trainer import run_training  # noqa: E402
from workers.sampling.fast_decode import fast_decoder  # noqa: E402
from workers.forward import cache_from, lm_forward  # noqa: E402
from workers.sampling.generation import SamplingParams, sample_responses  # noqa: E402
from workers.sampling.kv_cache import preallocated_cache  # noqa: E402
from workers.log_probs import position_ids_from_mask  # noqa: E402

RECIPE = ROOT / "recipes" / "quickstart.yaml"
# Qwen2.5-0.5B's architecture (config.json of Qwen/Qwen2.5-0.5B-Instruct), built with random weights.
QWEN_05B = {"model_type": "qwen2", "hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
            "num_key_value_heads": 2, "intermediate_size": 4864, "vocab_size": 151936, "tie_word_embeddings": True,
            "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6}
MODEL = {"config": {"model_type": "qwen2", "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 8,
                    "num_key_value_heads": 2, "intermediate_size": 512, "max_position_embeddings": 256}}
STEPS = 16


def build(dtype: str) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    """The check model on CUDA in ``dtype`` and a left-padded prompt batch."""
    tokenizer = load_tokenizer(MODEL)
    model = load_causal_lm({**MODEL, "dtype": dtype}, tokenizer, dtype=dtype, seed=0).cuda().eval()
    ids = torch.randint(5, 60, (8, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, :5] = 0
    mask[3, :2] = 0
    return model, ids.cuda(), mask.cuda()


def logit_difference(dtype: str) -> float:
    """Largest |fast - transformers| logit over STEPS decoding steps fed the same tokens."""
    model, ids, mask = build(dtype)
    tokens = torch.randint(5, 60, (STEPS, ids.shape[0], 1), generator=torch.Generator().manual_seed(1)).cuda()
    positions = position_ids_from_mask(mask)
    worst = 0.0
    with torch.inference_mode():
        caches = [cache_from(lm_forward(model, ids, mask, positions, cache=preallocated_cache(model, 12 + STEPS),
                                        use_cache=True, logits_to_keep=1)) for _ in range(2)]
        decoder = fast_decoder(model, caches[1], mask, STEPS, int(positions.max()) + 1 + STEPS)
        if decoder is None:
            raise RuntimeError(f"no fast decoder for the check model in {dtype}")
        grown, position, cache = mask, positions[:, -1:] + 1, caches[0]
        for token in tokens:
            grown = torch.cat([grown, torch.ones_like(grown[:, :1])], dim=1)
            out = lm_forward(model, token, grown, position, cache=cache, use_cache=True, logits_to_keep=1)
            cache = cache_from(out)
            fast = decoder.step(token, position)
            worst = max(worst, float((fast.float() - out.logits[:, -1].float()).abs().max()))
            position = position + 1
    return worst


def sample(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, fast: bool, greedy: bool) -> torch.Tensor:
    os.environ["RLHFCTL_FAST_DECODE"] = "1" if fast else "0"
    params = SamplingParams(n=4, max_new_tokens=64, temperature=1.0, do_sample=not greedy)
    responses, _ = sample_responses(model, ids, mask, params, eos_ids=[10_000], pad_id=0,
                                    generator=torch.Generator(device="cuda").manual_seed(3), samples_per_prompt=4)
    torch.cuda.synchronize()
    return responses


def _synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def engine_recipe(prompts: int, samples: int, response: int, model_config: dict, use_gpu: bool) -> dict:
    """The engine check's actor recipe: FSDP2, bf16 compute over float32 masters, lr 1e-6, checkpointed layers."""
    return {
        "trainer": {"seed": 0, "total_steps": 10, "ppo_epochs": 1, "batch_size": prompts},
        "rollout": {"n": samples, "max_new_tokens": response, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "do_sample": True},
        "resource_pools": {"main": {"use_gpu": use_gpu}},
        "data": {"task": "digits"},
        "roles": {"actor": {"strategy": "fsdp2", "micro_batch_size": 8, "optim": {"lr": 1e-6},
                            "model": {"config": dict(model_config), "dtype": "bfloat16", "gradient_checkpointing": True}},
                  "reward": {"function": "rlhfctl.tasks.digits:score"}},
    }


def engine_check(prompts: int, samples: int, response: int, model_config: dict | None = None,
                 device: str = "cuda") -> dict:
    """FSDP2 world 1, bf16 compute, 256-token responses on the Qwen2.5-0.5B shape: throughput and memory.

    ``device="cpu"`` (with a small ``model_config``) runs the same path without the CUDA memory figures,
    which is how the test suite keeps this script from rotting on machines without a GPU."""
    import numpy as np

    from rlhfctl.protocol import DataProto
    from rlhfctl.recipe.memory_plan import plan_memory
    from rlhfctl.recipe.pools import PoolInfo
    from rlhfctl.single_controller import ClassWithInitArgs, LocalWorkerGroup
    from workers import ActorWorker

    on_cuda = device == "cuda"
    recipe = engine_recipe(prompts, samples, response, model_config or QWEN_05B, use_gpu=on_cuda)
    planned = plan_memory(recipe, {"main": PoolInfo("main", ("actor",), (1,), on_cuda, 4, None)}).roles[0].largest
    peak_flops = (matmul_peak(4096, device="cuda", dtype=torch.bfloat16) if on_cuda
                  else matmul_peak(512, device="cpu", dtype=torch.bfloat16))
    if on_cuda:
        torch.cuda.reset_peak_memory_stats()
    group = LocalWorkerGroup(1, ClassWithInitArgs(ActorWorker, recipe, "actor"), role="actor")
    try:
        group.init_model()
        worker = group.workers[0]
        count = sum(p.numel() for p in worker.module.parameters())
        ids = torch.randint(5, 60, (prompts, 16), generator=torch.Generator().manual_seed(0))
        batch = DataProto.from_dict(tensors={"input_ids": ids, "attention_mask": torch.ones_like(ids)},
                                    non_tensors={"uid": np.asarray([f"p{i}" for i in range(prompts)], dtype=object)})
        before = group.state_fingerprint()[0]
        _synchronize(device)
        start = time.perf_counter()
        rollout = group.generate_sequences(batch)
        _synchronize(device)
        generate_s = time.perf_counter() - start
        tokens = int(rollout.batch["response_mask"].sum())
        advantages = torch.randn(rollout.batch["responses"].shape, generator=torch.Generator().manual_seed(1))
        update = rollout.union(DataProto.from_dict({"advantages": advantages}))
        start = time.perf_counter()
        metrics = group.update_actor(update)[0]
        _synchronize(device)
        update_s = time.perf_counter() - start
        moved = group.state_fingerprint()[0] != before
        dtypes = sorted({str(p.dtype) for p in worker.module.parameters()})
    finally:
        group.shutdown()
    gib = 1 << 30
    predicted = count * (4 + 4 + 8 + 2)
    update_tokens = int(update.batch["attention_mask"].sum())
    mfu = shares(count, peak_flops, update=(update_tokens, update_s), generate=(tokens, generate_s))
    results = {
        "engine_parameters_m": round(count / 1e6, 1), "engine_master_dtypes": dtypes,
        "engine_rollout_tokens": tokens, "engine_rollout_tokens_per_s": tokens / generate_s,
        "engine_update_tokens_per_s": update_tokens / update_s,
        "engine_bf16_matmul_peak_tflops": peak_flops / 1e12,
        "engine_mfu_generate": mfu["mfu/generate"], "engine_mfu_update": mfu["mfu/update"],
        "engine_grad_norm": metrics["actor/grad_norm"], "engine_masters_moved": moved,
        "engine_predicted_state_gib": predicted / gib,
        "engine_plan_state_gib": planned.state_bytes / gib, "engine_plan_device_gib": planned.device_bytes / gib,
    }
    if on_cuda:
        peak = torch.cuda.max_memory_allocated()
        results.update({"engine_max_allocated_gib": peak / gib, "engine_max_allocated_over_predicted": peak / predicted,
                        "engine_max_allocated_over_plan": peak / planned.device_bytes})
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5, help="quickstart training steps (default 5)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--backend", choices=("local", "ray"), default="local", help="ray.backend of the quickstart run")
    parser.add_argument("--engine-prompts", type=int, default=8, help="prompts of the engine check (x 4 samples)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        sys.exit(2)
    results: dict = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    failures = []
    for dtype, tolerance in (("float32", 1e-3), ("bfloat16", 0.1)):
        difference = logit_difference(dtype)
        results[f"max_logit_difference_{dtype}"] = difference
        if difference > tolerance:
            failures.append(f"fast step logits differ by {difference:.3g} in {dtype} (tolerance {tolerance})")
    model, ids, mask = build("bfloat16")
    same = torch.equal(sample(model, ids, mask, True, True), sample(model, ids, mask, False, True))
    results["greedy_tokens_equal_bfloat16"] = same
    timings: dict[bool, list[float]] = {True: [], False: []}
    for round_ in range(6):
        for fast in (True, False):
            start = time.perf_counter()
            sample(model, ids, mask, fast, greedy=False)
            if round_:
                timings[fast].append(time.perf_counter() - start)
    results["sampling_s_fast"] = statistics.median(timings[True])
    results["sampling_s_transformers"] = statistics.median(timings[False])
    os.environ.pop("RLHFCTL_FAST_DECODE", None)
    with tempfile.TemporaryDirectory() as out:
        cfg = load_recipe(RECIPE, ["resource_pools.main.use_gpu=true", f"trainer.total_steps={args.steps}", f"ray.backend={args.backend}",
                                   f"trainer.output_dir={out}", "trainer.val_every=0", "trainer.save_every=0"])
        start = time.perf_counter()
        summary = run_training(cfg)
        results["quickstart_s"] = time.perf_counter() - start
        records = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    results["quickstart_steps"] = len(records)
    results["quickstart_last_reward"] = records[-1].get("reward/mean") if records else None
    results["quickstart_summary"] = {key: value for key, value in summary.items() if isinstance(value, (int, float, str))}
    if len(records) != args.steps:
        failures.append(f"the quickstart ran {len(records)} of {args.steps} steps")
    results.update(engine_check(args.engine_prompts, 4, 256))
    if results["engine_master_dtypes"] != ["torch.float32"] or not results["engine_masters_moved"]:
        failures.append("the engine check's float32 master weights did not move under bf16 compute")
    for key, value in results.items():
        if key != "quickstart_summary":
            print(f"{key:32s} {value}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    if failures:
        print("FAILED: " + "; ".join(failures))
        sys.exit(1)
    print("all CUDA checks passed")


if __name__ == "__main__":
    main()
