"""Per-step metrics: what the batch says about the policy, and the metrics.jsonl log."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlhfctl.algorithms import explained_variance, masked_mean
from rlhfctl.protocol import DataProto
from rlhfctl.tasks.reward_fn import named_score_column, named_score_names


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    values = values.float()
    return {
        f"{prefix}/mean": values.mean().item(),
        f"{prefix}/std": values.std().item() if values.numel() > 1 else 0.0,
        f"{prefix}/max": values.max().item(),
        f"{prefix}/min": values.min().item(),
    }


def batch_metrics(batch: DataProto) -> dict[str, float]:
    """Reward, task score, length, advantage, value and KL statistics of one step's batch.

    ``reward/*`` is the reward the advantages start from (``token_level_scores``: the overlong penalty
    included, the in-reward KL not); ``score/mean`` is the reward function's or model's raw score before any
    shaping, and ``acc/mean`` its named ``acc`` where it returns one (also logged as ``reward/acc/mean``).
    """
    mask = batch.batch["response_mask"].float()  # the loss mask: the policy's own tokens
    rewards = batch.batch["token_level_scores"].sum(-1)
    metrics = _stats("reward", rewards)
    metrics.update(source_reward_metrics(rewards, batch.non_tensor_batch))
    metrics.update(task_score_metrics(batch.non_tensor_batch))
    # A response's length is its real tokens, the attention mask over it: with tool outputs (mask 0) the loss
    # mask has holes. For a single-turn rollout the two masks are equal.
    lengths = batch.batch["attention_mask"][:, -mask.shape[-1]:].float().sum(-1)
    metrics.update(_stats("response_length", lengths))
    # Responses are padded to exactly their width (max_new_tokens, or max_response_tokens): a full row ran out of budget.
    metrics["response_length/clip_ratio"] = (lengths >= mask.shape[-1]).float().mean().item()
    metrics["prompt_length/mean"] = batch.batch["attention_mask"].sum(-1).float().mean().item() - metrics["response_length/mean"]
    if "token_level_rewards" in batch.batch:
        metrics["reward/with_kl_mean"] = batch.batch["token_level_rewards"].sum(-1).mean().item()
    metrics["advantages/mean"] = masked_mean(batch.batch["advantages"], mask).item()
    metrics["returns/mean"] = masked_mean(batch.batch["returns"], mask).item()
    if "values" in batch.batch:
        metrics["values/mean"] = masked_mean(batch.batch["values"], mask).item()
        metrics["critic/explained_variance"] = float(explained_variance(batch.batch["values"], batch.batch["returns"], mask))
    if "ref_log_prob" in batch.batch and "old_log_probs" in batch.batch:
        metrics["kl"] = masked_mean(batch.batch["old_log_probs"] - batch.batch["ref_log_prob"], mask).item()
    for name in named_score_names(batch.non_tensor_batch):  # a reward function's dict: reward/<name>/mean
        metrics[f"reward/{name}/mean"] = float(np.mean(batch.non_tensor_batch[named_score_column(name)].astype(np.float64)))
    if "reward_error" in batch.non_tensor_batch:
        metrics["reward/errors"] = float(np.sum(batch.non_tensor_batch["reward_error"].astype(float)))
    if "judge_parse_error" in batch.non_tensor_batch:  # roles.reward.judge: verdicts scored judge.parse_error_score
        metrics["reward/judge_parse_errors"] = float(np.sum(batch.non_tensor_batch["judge_parse_error"].astype(float)))
    if "reward_retries" in batch.non_tensor_batch:  # roles.reward.remote: retries of the service's requests
        metrics["reward/remote_retries"] = float(np.sum(batch.non_tensor_batch["reward_retries"].astype(float)))
    if "entropys" in batch.batch:
        metrics["entropy"] = masked_mean(batch.batch["entropys"], mask).item()
    metrics.update(agent_metrics(batch))
    return metrics


def without_reward(metrics: dict[str, float]) -> dict[str, float]:
    """A step's metrics with the ``reward/*`` statistics dropped: a run without a reward role (distillation alone)
    has none to report, only the zero it trains on."""
    return {key: value for key, value in metrics.items() if not key.startswith("reward/")}


def source_reward_metrics(rewards: torch.Tensor, columns: Any) -> dict[str, float]:
    """``reward/<source>/mean`` per ``data_source`` value (a mixture of tasks, split by task), like validation's
    ``val/<source>/reward/mean``; none without the column. A source named like one of the batch's named scores
    is left out: ``reward/<name>/mean`` is that score's."""
    if "data_source" not in columns:
        return {}
    values = rewards.double().numpy()
    sources = np.array([str(source) for source in columns["data_source"]], dtype=object)
    named = set(named_score_names(columns))
    return {f"reward/{source}/mean": float(values[sources == source].mean())
            for source in sorted(set(sources.tolist())) if source and source not in named}


def task_score_metrics(columns: Any) -> dict[str, float]:
    """``score/mean`` (the reward's raw score, column ``score``) and ``acc/mean`` (its named ``acc``), where present."""
    metrics: dict[str, float] = {}
    if "score" in columns:
        metrics["score/mean"] = float(np.mean(np.asarray(columns["score"], dtype=np.float64)))
    if named_score_column("acc") in columns:
        metrics["acc/mean"] = float(np.mean(np.asarray(columns[named_score_column("acc")], dtype=np.float64)))
    return metrics


def agent_metrics(batch: DataProto) -> dict[str, float]:
    """An agent rollout's per-sample columns (``rollout.multi_turn``): ``agent/turns/mean``,
    ``agent/tool_calls/mean``, ``agent/tool_errors/mean``, ``agent/tool_latency_s/mean``,
    ``agent/truncated_fraction``, ``agent/policy_tokens/mean`` (mask-1 tokens per sample) and
    ``agent/tool/<name>/<key>/mean`` (a tool's own metrics, over the samples that called it); empty otherwise."""
    columns = batch.non_tensor_batch
    if "num_turns" not in columns:
        return {}
    metrics = {"agent/turns/mean": float(np.mean(columns["num_turns"].astype(np.float64)))}
    for name in ("tool_calls", "tool_errors", "tool_latency_s"):
        if f"agent/{name}" in columns:
            metrics[f"agent/{name}/mean"] = float(np.mean(columns[f"agent/{name}"].astype(np.float64)))
    if "agent/truncated" in columns:
        metrics["agent/truncated_fraction"] = float(np.mean(columns["agent/truncated"].astype(np.float64)))
    metrics["agent/policy_tokens/mean"] = batch.batch["response_mask"].float().sum(-1).mean().item()
    values: dict[str, list[float]] = {}
    for per_sample in columns.get("agent/tool_metrics", []):
        for key, value in dict(per_sample or {}).items():
            values.setdefault(key, []).append(float(value))
    for key in sorted(values):
        metrics[f"agent/tool/{key}/mean"] = float(np.mean(values[key]))
    return metrics


def validation_metrics(scores: np.ndarray, sources: np.ndarray | None, accuracy: np.ndarray | None = None,
                       groups: np.ndarray | None = None, k: int = 1) -> dict[str, float]:
    """``val/reward/mean`` and ``val/samples``, plus ``val/<source>/reward/mean`` per ``data_source`` value.

    With ``k`` responses per prompt (``groups``: one id per prompt) and their ``accuracy``, also
    ``val/pass@k`` and ``val/<source>/pass@k``: the best accuracy among a prompt's k responses, averaged
    over prompts (for a 0/1 accuracy, the share of prompts solved at least once in k tries).
    """
    selections = {"val": np.ones(len(scores), dtype=bool)}
    if sources is not None:
        for source in sorted({str(value) for value in sources}):
            selections[f"val/{source}"] = np.array([str(value) == source for value in sources])
    metrics: dict[str, float] = {}
    for prefix, chosen in selections.items():
        metrics[f"{prefix}/reward/mean"] = float(scores[chosen].mean())
        metrics[f"{prefix}/samples"] = float(chosen.sum())
        if accuracy is not None and groups is not None and k > 1:
            metrics[f"{prefix}/pass@{k}"] = _best_per_group_mean(accuracy[chosen], groups[chosen])
    return metrics


def _best_per_group_mean(values: np.ndarray, groups: np.ndarray) -> float:
    best: dict[Any, float] = {}
    for group, value in zip(groups.tolist(), values.tolist()):
        best[group] = max(best.get(group, -math.inf), float(value))
    return float(np.mean(list(best.values())))


def mean_over_ranks(per_rank: Any) -> dict[str, float]:
    """Average a metrics dict returned by every rank (or pass a single dict through)."""
    if isinstance(per_rank, dict):
        return {key: float(value) for key, value in per_rank.items()}
    dicts = [d for d in per_rank if isinstance(d, dict)]
    if not dicts:
        return {}
    return {key: sum(float(d[key]) for d in dicts) / len(dicts) for key in dicts[0]}


def first_non_finite(metrics: dict[str, float], keys: tuple[str, ...]) -> str | None:
    """The first of ``keys`` whose value is NaN or infinite, if any."""
    for key in keys:
        value = metrics.get(key)
        if value is not None and not math.isfinite(value):
            return key
    return None


class MetricsLog:
    """``<output_dir>/metrics.jsonl``: one JSON object per step; a resumed run drops steps past its checkpoint."""

    def __init__(self, output_dir: str | Path, resume_after_step: int | None = None) -> None:
        self.path = Path(output_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_after_step is None:
            self.path.write_text("")
        elif self.path.exists():
            kept = [line for line in self.path.read_text().splitlines()
                    if line.strip() and json.loads(line).get("step", 0) <= resume_after_step]
            self.path.write_text("".join(line + "\n" for line in kept))

    def write(self, step: int, metrics: dict[str, float]) -> None:
        """Append one step."""
        record = {"step": step, **{key: _json_number(value) for key, value in metrics.items()}}
        with self.path.open("a") as handle:
            handle.write(json.dumps(record) + "\n")

    def read(self) -> list[dict[str, Any]]:
        """Every logged step, in order."""
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]


def _json_number(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value
