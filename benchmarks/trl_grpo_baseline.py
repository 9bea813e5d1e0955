"""Seconds per GRPO optimizer step of TRL's GRPOTrainer on the model, batch and lengths of train_step.py.

    /tmp/trl-venv/bin/python benchmarks/trl_grpo_baseline.py [--size tiny|small|33m] [--steps 8] [--threads N]
                                                              [--bf16] [--json PATH] [--dry-run]
    /tmp/trl-venv/bin/python benchmarks/trl_grpo_baseline.py --model-path /tmp/sft33/model \
        --task 'repeat?max_len=256&alpha=1.2' --max-new-tokens 256      # the long-tail workload, from an SFT export

Runs in a separate virtualenv that has ``trl`` (see benchmarks/README.md); rlhfctl itself is imported
from this checkout only for the character tokenizer, the model config builder and the bundled tasks,
none of which needs Ray. The policy is a Qwen2ForCausalLM built from a config with seeded random weights
(nothing is downloaded). One optimizer step consumes 8 prompts x 4 samples of up to the size's new tokens
(32; 128 at ``33m``), as in ``benchmarks/train_step.py``; the first ``--warmup`` steps are left out of the
median. ``--dry-run`` builds the model and prints its architecture and parameters without training.

``--task`` names another bundled task (its prompts, ``data.num_train`` of them at seed 0 as rlhfctl draws them, and its
``score`` as the reward), ``--model-path`` starts from a saved model (an SFT export) instead of the size's random one,
and ``--max-new-tokens`` overrides the size's completion length: ``benchmarks/vs_trl_long_tail.py`` times the
long-tail ``repeat`` workload this way.

``--bf16`` sets ``GRPOConfig(bf16=True)`` (TRL's own default; float32 otherwise): accelerate's native mixed precision,
on CPU ``torch.autocast("cpu", dtype=torch.bfloat16)`` around the model's forward with float32 weights and optimizer
state. Generation calls the same forward, so it samples in bf16 too; the result records the dtype the model's output
layer returned during the timed ``generate`` calls and during the rest of the step, so the run shows what it computed in.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# Nothing may reach the hub: the model is built from a config and the tokenizer is code.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
import transformers  # noqa: E402
import trl  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, TrainerCallback  # noqa: E402
from transformers.trainer_callback import PrinterCallback  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from rlhfctl.models.loading import build_config  # noqa: E402
from rlhfctl.models.tokenizer import CharTokenizer  # noqa: E402
from rlhfctl.tasks import get_task  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_sizes import SIZES  # noqa: E402  (the sizes train_step.py times, field for field)
PROMPTS_PER_STEP = 8
GENERATIONS = 4
TEMPERATURE = 1.0
NUM_PROMPTS = 64  # the digits task's prompts (what the timings of the sizes used)
TASK_PROMPTS = 512  # any other task's: data.num_train's default, as rlhfctl draws them
SEED = 0


def build_model(size: str, tokenizer: CharTokenizer) -> torch.nn.Module:
    """Qwen2ForCausalLM from a config, seeded random init, float32: the same config rlhfctl builds."""
    config = build_config({"config": architecture(size)}, tokenizer)  # vocab 100 and pad/eos/bos ids from the tokenizer
    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(config)
    model.config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def architecture(size: str) -> dict[str, object]:
    """The inline qwen2 fields of ``size``, as train_step.py puts them in the recipe."""
    return {"model_type": "qwen2", **SIZES[size]["model"]}


def task_reward(task: str, lengths: list[float]):  # noqa: ANN201
    """The bundled task's ``score`` under TRL's reward signature (extra kwargs: trainer_state, log_* ...); each call
    also notes its completions' mean length in characters (the character tokenizer's tokens, EOS not counted)."""
    score = get_task(task).score

    def reward(prompts: list[str], completions: list[str], ground_truth: list[str], **_: object) -> list[float]:
        lengths.append(statistics.mean(len(text) for text in completions))
        return score(list(prompts), list(completions), ground_truth=list(ground_truth))

    reward.__name__ = f"{task.partition('?')[0]}_reward"  # TRL names its reward metrics after the function
    return reward


def load_model(model_path: Path, tokenizer: CharTokenizer) -> torch.nn.Module:
    """A saved model (an SFT export, safetensors), float32, with the tokenizer's pad and EOS ids for generation."""
    model = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.float32, trust_remote_code=False)
    model.config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


class StepTimer(TrainerCallback):
    """perf_counter at the start and end of every optimizer step (generation + reward + loss + update).

    ``wrap_generate`` also sums the time spent in the policy's ``generate`` per step, so the step splits
    into generation and the rest (reward, advantages, loss forward/backward, optimizer step).
    """

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.generate: list[float] = []
        self.generating = False
        self.output_dtypes: dict[str, set[str]] = {"generate": set(), "rest": set()}

    def watch_dtype(self, model: torch.nn.Module) -> None:
        """Note the dtype of the output layer's logits in and out of ``generate`` (bf16 under autocast)."""

        def hook(module, inputs, output):  # noqa: ANN001, ANN202
            self.output_dtypes["generate" if self.generating else "rest"].add(str(output.dtype))

        model.get_output_embeddings().register_forward_hook(hook)

    def wrap_generate(self, model: torch.nn.Module) -> None:
        inner = model.generate

        def timed_generate(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            start = time.perf_counter()
            self.generating = True
            try:
                return inner(*args, **kwargs)
            finally:
                self.generating = False
                if self.generate:
                    self.generate[-1] += time.perf_counter() - start

        model.generate = timed_generate  # TRL calls generate on the unwrapped policy, i.e. this instance

    def on_step_begin(self, args, state, control, **kwargs):  # noqa: ANN001, ANN003, D102
        self.generate.append(0.0)
        self.starts.append(time.perf_counter())

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN003, D102
        self.ends.append(time.perf_counter())


def make_args(out_dir: str, total_steps: int, beta: float, new_tokens: int, bf16: bool = False) -> GRPOConfig:
    # One optimizer step per generation batch: per_device_train_batch_size counts *completions*, so 32 rows
    # = 8 prompts x 4 generations; gradient_accumulation_steps=1 makes steps_per_generation=1 and
    # generation_batch_size=32, and num_iterations=1 keeps it on-policy (no separate old-logprob pass).
    return GRPOConfig(
        output_dir=out_dir,
        per_device_train_batch_size=PROMPTS_PER_STEP * GENERATIONS,
        gradient_accumulation_steps=1,
        num_generations=GENERATIONS,
        num_iterations=1,
        max_completion_length=new_tokens,
        temperature=TEMPERATURE,
        top_p=1.0,
        top_k=0,
        beta=beta,
        learning_rate=1e-3,
        lr_scheduler_type="constant",
        max_grad_norm=1.0,
        max_steps=total_steps,
        use_vllm=False,
        use_cpu=True,
        bf16=bf16,  # GRPOConfig defaults to True when unset; False keeps the float32 comparison unless --bf16
        fp16=False,
        gradient_checkpointing=False,  # TRL's default is True; rlhfctl's quickstart does not checkpoint
        logging_strategy="no",
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        disable_tqdm=True,
        log_completions=False,
        dataloader_num_workers=0,
        seed=SEED,
    )


def run(size: str, steps: int, warmup: int, beta: float, threads: int | None, bf16: bool = False,
        task: str = "digits", model_path: Path | None = None, new_tokens: int | None = None) -> dict:
    if threads:
        torch.set_num_threads(threads)
    tokenizer = CharTokenizer()
    model = build_model(size, tokenizer) if model_path is None else load_model(model_path, tokenizer)
    new_tokens = new_tokens or SIZES[size]["new_tokens"]
    prompts = NUM_PROMPTS if task == "digits" else TASK_PROMPTS
    dataset = Dataset.from_list(get_task(task).make_prompts(prompts, SEED))  # columns: prompt, ground_truth
    timer, lengths = StepTimer(), []
    with tempfile.TemporaryDirectory(prefix="trl-grpo-") as out_dir:
        if beta != 0.0 and model_path is None:
            # With beta > 0 TRL rebuilds the reference from the policy's name_or_path: give it a local one.
            model_dir = Path(out_dir) / "init"
            model.save_pretrained(model_dir)
            model = AutoModelForCausalLM.from_pretrained(model_dir)
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=task_reward(task, lengths),
            args=make_args(out_dir, warmup + steps, beta, new_tokens, bf16),
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[timer],
        )
        timer.wrap_generate(model)
        timer.watch_dtype(model)
        trainer.remove_callback(PrinterCallback)  # disable_tqdm adds it; it would print the end-of-run summary
        t0 = time.perf_counter()
        trainer.train()
        total = time.perf_counter() - t0
    durations = [end - start for start, end in zip(timer.starts, timer.ends)]
    timed = durations[warmup:] or durations
    generate = timer.generate[warmup:] or timer.generate
    return {
        "framework": f"trl {trl.__version__}",
        "model": SIZES[size]["label"] if model_path is None else str(model_path),
        "size": size if model_path is None else None,
        "task": task,
        "params": sum(p.numel() for p in trainer.model.parameters()),
        "prompts_per_step": PROMPTS_PER_STEP,
        "generations": GENERATIONS,
        "max_completion_length": new_tokens,
        "temperature": TEMPERATURE,
        "architecture": architecture(size) if model_path is None else None,
        "beta": beta,
        "bf16": bf16,
        "mixed_precision": str(trainer.accelerator.mixed_precision),
        "native_amp": bool(trainer.accelerator.native_amp),
        "output_dtypes": {phase: sorted(dtypes) for phase, dtypes in timer.output_dtypes.items()},
        "torch_threads": torch.get_num_threads(),
        "warmup_steps": warmup,
        "timed_steps": len(timed),
        "median_s_per_step": statistics.median(timed),
        "mean_s_per_step": statistics.mean(timed),
        "min_s_per_step": min(timed),
        "max_s_per_step": max(timed),
        "median_generate_s": statistics.median(generate),
        "all_step_seconds": durations,
        "all_generate_seconds": timer.generate,
        "completion_chars": lengths,  # the mean per reward call, one call per generation batch
        "train_wall_s": total,
        "versions": {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__,
                     "python": platform.python_version()},
        "load_avg_after": list(os.getloadavg()),
    }


def describe(size: str, threads: int | None, bf16: bool = False) -> dict:
    """What ``run`` would time: the built model's architecture and parameters, the batch and the threads."""
    if threads:
        torch.set_num_threads(threads)
    model = build_model(size, CharTokenizer())
    return {"model": SIZES[size]["label"], "architecture": architecture(size),
            "parameters": sum(p.numel() for p in model.parameters()), "prompts": PROMPTS_PER_STEP, "n": GENERATIONS,
            "new_tokens": SIZES[size]["new_tokens"], "temperature": TEMPERATURE, "torch_threads": torch.get_num_threads(),
            "bf16": bf16}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--steps", type=int, default=8, help="timed optimizer steps (default 8)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (default 2)")
    parser.add_argument("--beta", type=float, default=0.0,
                        help="KL coefficient; 0.0 (TRL's default) skips the reference model, 0.001 matches the "
                             "quickstart's KL loss")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--bf16", action="store_true",
                        help="GRPOConfig(bf16=True): bf16 autocast over float32 weights, generation included (default float32)")
    parser.add_argument("--task", default="digits", help="bundled task: its prompts and reward (default digits)")
    parser.add_argument("--model-path", type=Path, default=None,
                        help="start from this saved model (an SFT export) instead of --size's random one")
    parser.add_argument("--max-new-tokens", type=int, default=None,
                        help="max_completion_length (default: --size's new tokens)")
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    parser.add_argument("--dry-run", action="store_true", help="build the model, print what would run, train nothing")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    transformers.utils.logging.disable_progress_bar()
    if args.dry_run:
        described = describe(args.size, args.threads, args.bf16)
        print(json.dumps(described))
        if args.json:
            args.json.write_text(json.dumps(described, indent=1))
        return
    result = run(args.size, args.steps, args.warmup, args.beta, args.threads, args.bf16, args.task, args.model_path,
                 args.max_new_tokens)
    print(f"{result['framework']}  {result['model']}  {result['params']:,} params  beta={result['beta']}  "
          f"torch threads={result['torch_threads']}  bf16={result['bf16']} (mixed_precision "
          f"{result['mixed_precision']}; logits {result['output_dtypes']})")
    print(f"{PROMPTS_PER_STEP} prompts x {GENERATIONS} generations, <= {result['max_completion_length']} new tokens; "
          f"{result['timed_steps']} timed steps after {result['warmup_steps']} warm-up")
    print(f"median {result['median_s_per_step']:.3f} s/step  (mean {result['mean_s_per_step']:.3f}, "
          f"min {result['min_s_per_step']:.3f}, max {result['max_s_per_step']:.3f}); "
          f"of which generate {result['median_generate_s']:.3f} s (median)")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
