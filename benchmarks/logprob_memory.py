"""Peak memory and time of the log-prob + entropy pass: the output layer scored in token chunks against the
whole micro-batch's logits at once (``chunk_tokens=0``, the pass before chunking), on CPU.

A tiny model body (2 layers, hidden 256) with a 152,064-token vocabulary (Qwen2.5's), so the logits
dominate; 16 rows x 512 response tokens = 8,192 scored tokens, float32, no gradient (the pass
``compute_log_prob`` runs), with entropies. Each sample runs in a fresh subprocess: it builds the model,
runs the pass on two short rows to warm up, resets the kernel's peak-RSS counter (``/proc/self/clear_refs``), runs the
timed pass, and reports ``VmHWM - RSS before the pass``: real resident bytes, torch's allocations included.
Samples alternate between the two variants, so load from other processes hits both; the table shows the
largest peak and the median time of each, the median of the rounds' time ratios, and the largest difference of their log-probs and entropies.

    .venv/bin/python benchmarks/logprob_memory.py                 # 3 samples per variant, a few minutes
    .venv/bin/python benchmarks/logprob_memory.py --tokens 2048 --repeats 5

:func:`chunked_vs_unchunked` runs the same comparison in-process on any model and batch (the device check
calls it on CUDA, where it reads ``torch.cuda.max_memory_allocated``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlhfctl.engine.log_probs import LOGITS_CHUNK_TOKENS, position_ids_from_mask, sequence_log_probs  # noqa: E402

__all__ = ["chunked_vs_unchunked", "main", "tiny_model", "rollout_batch"]

VOCAB = 152064
PROMPT = 32
ROWS = 16


def tiny_model(vocab: int = VOCAB) -> nn.Module:
    """A Qwen2 body of 2 layers, hidden 256, with the given vocabulary, float32, eval mode."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=vocab, max_position_embeddings=4096)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config).eval()


def rollout_batch(tokens: int, vocab: int = VOCAB, rows: int = ROWS) -> dict[str, torch.Tensor]:
    """``rows`` rows of a 32-token prompt and ``tokens / rows`` response tokens, some left padding."""
    generator = torch.Generator().manual_seed(0)
    response = max(1, tokens // rows)
    ids = torch.randint(1, vocab, (rows, PROMPT + response), generator=generator)
    mask = torch.ones_like(ids)
    mask[::2, : PROMPT // 2] = 0  # every other prompt is shorter
    ids = ids * mask
    return {"input_ids": ids, "attention_mask": mask, "responses": ids[:, PROMPT:],
            "position_ids": position_ids_from_mask(mask)}


def _rss_bytes(field: str) -> int:
    return int(re.search(rf"{field}:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1)) * 1024


def _measured(run: Callable[[], Any], device: torch.device) -> tuple[Any, float, int]:
    """``run()``'s result, its seconds and its peak memory over what was allocated before it (bytes)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    else:
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM (peak RSS) to the current RSS
        before = _rss_bytes("VmRSS")
    start = time.perf_counter()
    result = run()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else _rss_bytes("VmHWM")
    return result, seconds, peak - before


def _pass(model: nn.Module, batch: Mapping[str, torch.Tensor], chunk_tokens: int, temperature: float,
          padding_free: bool) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.inference_mode():
        return sequence_log_probs(model, batch, temperature=temperature, with_entropy=True,
                                  padding_free=padding_free, chunk_tokens=chunk_tokens)


def chunked_vs_unchunked(
    model: nn.Module,
    batch: Mapping[str, torch.Tensor],
    *,
    temperature: float = 1.0,
    padding_free: bool = False,
    chunk_tokens: int = LOGITS_CHUNK_TOKENS,
    repeats: int = 3,
) -> dict[str, float]:
    """The chunked pass against the unchunked one on ``model``'s device: peak bytes, median seconds, diffs.

    ``batch`` must be on the model's device. Peaks are over the memory held before each pass
    (``max_memory_allocated`` on CUDA, peak RSS on CPU); each variant runs once to warm up first.
    """
    device = next(model.parameters()).device
    results: dict[str, dict[str, Any]] = {}
    for name, chunk in (("unchunked", 0), ("chunked", chunk_tokens)):
        _pass(model, batch, chunk, temperature, padding_free)
        samples = [_measured(lambda: _pass(model, batch, chunk, temperature, padding_free), device)
                   for _ in range(max(1, repeats))]
        results[name] = {"out": samples[-1][0], "seconds": statistics.median(s[1] for s in samples),
                         "peak": max(s[2] for s in samples)}
    (full_lp, full_ent), (lp, ent) = results["unchunked"]["out"], results["chunked"]["out"]
    return {
        "chunk_tokens": float(chunk_tokens),
        "unchunked_peak_bytes": float(results["unchunked"]["peak"]),
        "chunked_peak_bytes": float(results["chunked"]["peak"]),
        "unchunked_seconds": results["unchunked"]["seconds"],
        "chunked_seconds": results["chunked"]["seconds"],
        "max_abs_diff_log_probs": float((lp - full_lp).abs().max()),
        "max_abs_diff_entropy": float((ent - full_ent).abs().max()),
    }


def _sample(args: argparse.Namespace) -> None:
    """One subprocess sample: build, warm up, measure one pass; JSON on stdout, outputs to ``--save``."""
    torch.set_num_threads(args.threads)
    model, batch = tiny_model(args.vocab), rollout_batch(args.tokens, args.vocab)
    warm_up = {key: value[:2, -PROMPT - 8 :] for key, value in batch.items() if key != "responses"}
    warm_up["responses"] = warm_up["input_ids"][:, -8:]
    _pass(model, warm_up, args.chunk, args.temperature, args.padding_free)  # kernels and threads, not the pages
    (log_probs, entropy), seconds, peak = _measured(
        lambda: _pass(model, batch, args.chunk, args.temperature, args.padding_free), torch.device("cpu"))
    torch.save({"log_probs": log_probs, "entropy": entropy}, args.save)
    print(json.dumps({"seconds": seconds, "peak": peak}))


def _run_sample(args: argparse.Namespace, chunk: int, save: Path) -> dict[str, float]:
    command = [sys.executable, __file__, "--sample", "--chunk", str(chunk), "--save", str(save),
               "--tokens", str(args.tokens), "--vocab", str(args.vocab), "--threads", str(args.threads),
               "--temperature", str(args.temperature)] + (["--padding-free"] if args.padding_free else [])
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"sample chunk={chunk} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _table(args: argparse.Namespace, samples: dict[int, list[dict[str, float]]], diffs: tuple[float, float]) -> str:
    gib = 2**30
    full, chunked = samples[0], samples[args.chunk_tokens]
    peak_full, peak_chunked = max(s["peak"] for s in full), max(s["peak"] for s in chunked)
    time_full = statistics.median(s["seconds"] for s in full)
    time_chunked = statistics.median(s["seconds"] for s in chunked)
    paired = [a["seconds"] / b["seconds"] for a, b in zip(full, chunked)]  # the two samples of one round
    rows = [
        "| variant | peak over the pass (GiB) | median time (s) |",
        "| --- | --- | --- |",
        f"| unchunked (`chunk_tokens=0`, before) | {peak_full / gib:.2f} | {time_full:.2f} |",
        f"| chunked ({args.chunk_tokens} tokens, after) | {peak_chunked / gib:.2f} | {time_chunked:.2f} |",
        f"| ratio (before / after) | {peak_full / max(peak_chunked, 1):.1f}x lower | "
        f"{statistics.median(paired):.2f}x, the median of each round's ratio "
        f"({', '.join(f'{r:.2f}' for r in paired)}; >1: chunked faster) |",
    ]
    tokens = args.tokens // ROWS * ROWS
    head = (f"{tokens} response tokens ({ROWS} rows), vocab {args.vocab}, hidden 256, 2 layers, float32, no grad, "
            f"with entropy, temperature {args.temperature}, {'packed' if args.padding_free else 'padded'} rows; "
            f"{args.repeats} samples per variant, each in a fresh subprocess, {args.threads} threads. "
            "Peak: VmHWM minus RSS before the pass (kernel-counted resident bytes).")
    diff = f"max |log-prob difference| {diffs[0]:.2e}, max |entropy difference| {diffs[1]:.2e}"
    return "\n".join([head, "", *rows, "", diff])


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (or, with ``--sample``, one subprocess sample) and print its table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--vocab", type=int, default=VOCAB)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--padding-free", action="store_true")
    parser.add_argument("--chunk-tokens", type=int, default=LOGITS_CHUNK_TOKENS)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--sample", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--chunk", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--save", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.sample:
        _sample(args)
        return 0
    samples: dict[int, list[dict[str, float]]] = {0: [], args.chunk_tokens: []}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            order = (0, args.chunk_tokens) if repeat % 2 == 0 else (args.chunk_tokens, 0)
            for chunk in order:
                samples[chunk].append(_run_sample(args, chunk, Path(tmp) / f"{chunk}.pt"))
                print(f"sample {repeat + 1}/{args.repeats} chunk_tokens={chunk}: {samples[chunk][-1]}", file=sys.stderr)
        full, chunked = (torch.load(Path(tmp) / f"{chunk}.pt") for chunk in (0, args.chunk_tokens))
    diffs = tuple(float((chunked[key] - full[key]).abs().max()) for key in ("log_probs", "entropy"))
    print(_table(args, samples, diffs))
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "samples": samples,
                                         "max_abs_diff": diffs}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
