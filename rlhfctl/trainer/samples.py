"""Sample completions (``trainer.log_samples``): what the policy writes, next to the metrics.

Each step, the first N prompts of the batch (their first response each) with their scores go to
``output_dir/samples.jsonl`` (for an agent rollout with the whole conversation, ``messages``, whose tool
turns have the role ``tool``, and ``tool_rewards``) and, as text, to the loggers that show text (TensorBoard; the console
shows one sample every ``log_every`` steps).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlhfctl.protocol import DataProto

__all__ = ["SAMPLES_FILE", "SampleLog"]

SAMPLES_FILE = "samples.jsonl"


class SampleLog:
    """Keeps N samples of the step's batch (:meth:`take`) and writes them with the step (:meth:`write`)."""

    def __init__(self, output_dir: Path, count: int, tokenizer: Any) -> None:
        self.path = Path(output_dir) / SAMPLES_FILE
        self.count, self.tokenizer = int(count), tokenizer
        self._pending: list[dict[str, Any]] = []
        self._opened = False

    def take(self, batch: DataProto) -> None:
        """Decode the first response to each of the first N prompts of a scored batch."""
        if self.count <= 0:
            return
        uids = batch.non_tensor_batch.get("uid")
        rows, seen = [], set()
        for index in range(len(batch)):
            uid = uids[index] if uids is not None else index
            if uid in seen:
                continue
            seen.add(uid)
            rows.append(index)
            if len(rows) == self.count:
                break
        self._pending = [self._sample(batch, index) for index in rows]

    def _sample(self, batch: DataProto, index: int) -> dict[str, Any]:
        tensors = batch.batch
        prompt_ids = tensors["prompts"][index]
        prompt_mask = tensors["attention_mask"][index, : prompt_ids.shape[-1]].bool()
        prompt = self.tokenizer.decode(prompt_ids[prompt_mask].tolist(), skip_special_tokens=True)
        texts = batch.non_tensor_batch.get("response_text")
        if texts is not None:
            response = str(texts[index])
        else:
            width = tensors["responses"].shape[-1]
            length = int(tensors["attention_mask"][index, -width:].sum())  # the real tokens (tool outputs too)
            response = self.tokenizer.decode(tensors["responses"][index, :length].tolist(), skip_special_tokens=True)
        sample = {"prompt": prompt, "response": response, "score": float(tensors["token_level_scores"][index].sum())}
        messages = batch.non_tensor_batch.get("messages")
        if messages is not None:  # an agent rollout: the whole conversation, tool turns marked by their role
            sample["messages"] = [_plain_message(message) for message in list(messages[index])]
            tool_rewards = batch.non_tensor_batch.get("tool_rewards")
            if tool_rewards is not None:
                sample["tool_rewards"] = float(tool_rewards[index])
        verdicts = batch.non_tensor_batch.get("judge_verdict")  # roles.reward.judge: what the judge wrote
        if verdicts is not None:
            sample["judge_verdict"] = str(verdicts[index])
        errors = batch.non_tensor_batch.get("reward_error")
        if errors is not None and errors[index]:
            sample["reward_error"] = str(errors[index])
        return sample

    def write(self, step: int, loggers: Any) -> None:
        """Append the samples taken this step to samples.jsonl (dropping a resumed run's later steps) and the loggers."""
        if not self._pending:
            return
        if not self._opened:
            self._keep_steps_before(step)
            self._opened = True
        with self.path.open("a", encoding="utf-8") as handle:
            for sample in self._pending:
                handle.write(json.dumps({"step": step, **sample}) + "\n")
        loggers.text(step, "samples", [_as_text(sample) for sample in self._pending])
        self._pending = []

    def _keep_steps_before(self, step: int) -> None:
        """The file as a run starting at ``step`` finds it: a fresh run empties it, a resumed one keeps earlier steps."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept = []
        if self.path.exists():
            kept = [line for line in self.path.read_text(encoding="utf-8").splitlines()
                    if line.strip() and json.loads(line).get("step", 0) < step]
        self.path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")


def _plain_message(message: Any) -> dict[str, Any]:
    """A message as JSON can hold it (tool-call arguments included)."""
    return json.loads(json.dumps(dict(message), default=str))


def _as_text(sample: dict[str, Any]) -> str:
    if "messages" not in sample:
        return f"{sample['prompt']!r} -> {sample['response']!r} (score {sample['score']:.4g})"
    lines = []
    for message in sample["messages"]:
        role = str(message.get("role"))
        tag = f"[tool {message['name']}]" if role == "tool" and message.get("name") else f"[{role}]"
        lines.append(f"{tag} {message.get('content', '')!r}")
        for call in message.get("tool_calls") or []:
            function = call.get("function", {})
            lines.append(f"  -> call {function.get('name')}({json.dumps(function.get('arguments', {}))})")
    return "\n".join(lines) + f"\n(score {sample['score']:.4g})"
