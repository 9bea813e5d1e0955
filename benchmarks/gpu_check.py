"""One short check of the CUDA path, for a machine with a GPU: run it once and read the table.

    python benchmarks/gpu_check.py [--steps 5] [--json results.json]

1. The fast decoding step (rlhfctl/rollout/fast_decode.py) against transformers' step on CUDA, in float32 and
   bfloat16: the largest logit difference and whether greedy sampling gives the same tokens.
2. Sampling time on CUDA with the fast step and without (``RLHFCTL_FAST_DECODE=0``), alternating.
3. The quickstart recipe trained for a few steps with ``resource_pools.main.use_gpu=true``, with
   ``ray.backend: local`` by default (a GPU box may have no Ray; ``--backend ray`` uses a private local
   Ray, where NCCL is picked for CUDA workers), and the reward it reached.
4. The training engine on a Qwen2.5-0.5B-shaped model (inline config, random weights, 494M parameters):
   FSDP2 at world 1, bf16 compute over float32 master weights, 256-token responses. Each phase (rollout,
   log-prob pass, update) runs once with CUDA's peak counter reset before it: tokens/s, model-FLOPs
   utilization over a bf16 matmul peak measured in the same run (``benchmarks/flops.py``), and
   ``max_memory_allocated`` against the memory plan's prediction for that phase (target: within 10%).
   One untimed round comes first (AdamW's moments appear at its first step; the plan counts them from the
   start), and the update's peak is the one the actor reports from inside the call. Then a sharded save,
   one more update and a reload, blocking and asynchronous: the next-step log-probs must be bit-equal.
5. The same shape with a LoRA adapter (r 16): the same figures.
6. The chunked log-prob and entropy pass against the unchunked one at the check's vocabulary: the largest
   log-prob difference, both peaks and both times.

It prints the device, torch, CUDA and transformers versions first. It needs torch, transformers and peft, and omegaconf, which the recipe package reads (``benchmarks/README.md``
says how to carry it as a wheel); no Ray (``ray.backend: local``), no vLLM and no typer. It prints one markdown table, exits 1 when a check
fails and 2 when there is no CUDA device. Nothing is downloaded. Under 8 minutes.
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

from engine_check import QWEN_05B, engine_check, engine_recipe, memory_failures, timed  # noqa: E402,F401
from flops import matmul_peak  # noqa: E402

from rlhfctl.models.loading import load_causal_lm, load_tokenizer  # noqa: E402
from rlhfctl.rollout.fast_decode import fast_decoder  # noqa: E402
from rlhfctl.engine.forward import cache_from, lm_forward  # noqa: E402
from rlhfctl.rollout.generation import SamplingParams, sample_responses  # noqa: E402
from rlhfctl.rollout.kv_cache import preallocated_cache  # noqa: E402
from rlhfctl.engine.log_probs import position_ids_from_mask  # noqa: E402

RECIPE = ROOT / "recipes" / "quickstart.yaml"
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


def decoding_checks(results: dict, failures: list[str]) -> None:
    """Parts 1 and 2: the fast decoding step against transformers' step, and sampling time with and without it."""
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


def quickstart_check(results: dict, failures: list[str], steps: int, backend: str) -> None:
    """Part 3: the quickstart recipe on the GPU for ``steps`` steps."""
    from rlhfctl.recipe import load_recipe
    from rlhfctl.trainer import run_training

    with tempfile.TemporaryDirectory() as out:
        cfg = load_recipe(RECIPE, ["resource_pools.main.use_gpu=true", f"trainer.total_steps={steps}", f"ray.backend={backend}",
                                   f"trainer.output_dir={out}", "trainer.val_every=0", "trainer.save_every=0"])
        start = time.perf_counter()
        run_training(cfg)
        results["quickstart_s"] = time.perf_counter() - start
        records = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    results["quickstart_steps"] = len(records)
    results["quickstart_last_reward"] = records[-1].get("reward/mean") if records else None
    if len(records) != steps:
        failures.append(f"the quickstart ran {len(records)} of {steps} steps")


def engine_checks(results: dict, failures: list[str], prompts: int) -> None:
    """Parts 4-6: the engine on the Qwen2.5-0.5B shape (full and LoRA) and the chunked log-prob pass."""
    peak = matmul_peak(4096, device="cuda", dtype=torch.bfloat16)
    for prefix, lora in (("engine", None), ("lora", {"r": 16, "alpha": 32})):
        results.update(engine_check(prompts, 4, 256, lora=lora, peak_flops=peak, prefix=prefix))
        failures.extend(memory_failures(results, prefix))
        if not results[f"{prefix}_masters_moved"]:
            failures.append(f"{prefix}: the trainable float32 weights did not move")
        for kind in ("reload", "async_reload"):
            if not results[f"{prefix}_{kind}_bit_equal"]:
                failures.append(f"{prefix}: the {kind.replace('_', ' ')}ed checkpoint's next-step log-probs are not bit-equal")
    if results["engine_master_dtypes"] != ["torch.float32"]:
        failures.append(f"the engine's masters are {results['engine_master_dtypes']}, not float32")
    results.update(chunked_logprob_check("cuda"))
    if results["chunked_max_abs_diff"] > CHUNKED_TOLERANCE:
        failures.append(f"chunked log-probs differ by {results['chunked_max_abs_diff']:.3g} (tolerance {CHUNKED_TOLERANCE})")


CHUNKED_TOLERANCE = 1e-4  # float32 log-probs and entropies, chunked against unchunked (kernels differ by shape)


def chunked_logprob_check(device: str, tokens: int = 8192, vocab: int = 152064) -> dict:
    """Part 6: the log-prob and entropy pass with the output layer in token chunks against the whole logits at
    once, at Qwen2.5's vocabulary (``benchmarks/logprob_memory.py``): peaks, times and the largest difference."""
    from logprob_memory import chunked_vs_unchunked, rollout_batch, tiny_model

    model = tiny_model(vocab).to(device)
    batch = {key: value.to(device) for key, value in rollout_batch(tokens, vocab).items()}
    measured = chunked_vs_unchunked(model, batch)
    return {
        "chunked_tokens": tokens, "chunked_chunk_tokens": int(measured["chunk_tokens"]),
        "chunked_peak_gib": measured["chunked_peak_bytes"] / (1 << 30),
        "unchunked_peak_gib": measured["unchunked_peak_bytes"] / (1 << 30),
        "chunked_peak_ratio": measured["unchunked_peak_bytes"] / max(1.0, measured["chunked_peak_bytes"]),
        "chunked_speed_ratio": measured["unchunked_seconds"] / measured["chunked_seconds"],
        "chunked_max_abs_diff": max(measured["max_abs_diff_log_probs"], measured["max_abs_diff_entropy"]),
    }


def print_table(results: dict) -> None:
    """Every result as one markdown table, ready for docs/performance.md."""
    print("| result | value |")
    print("|---|---|")
    for key, value in results.items():
        shown = f"{value:.4g}" if isinstance(value, float) else str(value)
        print(f"| {key} | {shown} |")


def versions() -> dict:
    """The device and the versions the check ran with (torch, its CUDA, transformers), printed first."""
    import transformers

    return {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda,
            "transformers": transformers.__version__}


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
    results: dict = versions()
    print(" ".join(f"{key} {value}" for key, value in results.items()), flush=True)  # before anything can fail
    failures: list[str] = []
    started = time.perf_counter()
    decoding_checks(results, failures)
    quickstart_check(results, failures, args.steps, args.backend)
    engine_checks(results, failures, args.engine_prompts)
    results["check_minutes"] = (time.perf_counter() - started) / 60
    print_table(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    if failures:
        print("FAILED: " + "; ".join(failures))
        sys.exit(1)
    print("all CUDA checks passed")


if __name__ == "__main__":
    main()
