"""One short check of the CUDA path, for a machine with a GPU: run it once and read the table.

    python benchmarks/gpu_check.py [--steps 5] [--json results.json]

1. The fast decoding step (workers/sampling/fast_decode.py) against transformers' step on CUDA, in float32 and
   bfloat16: the largest logit difference and whether greedy sampling gives the same tokens.
2. Sampling time on CUDA with the fast step and without (``RLHFCTL_FAST_DECODE=0``), alternating.
3. The quickstart recipe trained for a few steps with ``resource_pools.main.use_gpu=true`` on a
   private local Ray (NCCL is picked for CUDA workers), and the reward it reached.

Exits 1 when a check fails, 2 when there is no CUDA device. Nothing is downloaded.
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

from rlhfctl.models.loading import load_causal_lm, load_tokenizer  # noqa: E402
from rlhfctl.recipe import load_recipe  # noqa: E402
from rlhfctl.trainer import run_training  # noqa: E402
from workers.sampling.fast_decode import fast_decoder  # noqa: E402
from workers.forward import cache_from, lm_forward  # noqa: E402
from workers.sampling.generation import SamplingParams, sample_responses  # noqa: E402
from workers.sampling.kv_cache import preallocated_cache  # noqa: E402
from workers.log_probs import position_ids_from_mask  # noqa: E402

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5, help="quickstart training steps (default 5)")
    parser.add_argument("--json", type=Path, default=None)
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
        cfg = load_recipe(RECIPE, ["resource_pools.main.use_gpu=true", f"trainer.total_steps={args.steps}",
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
