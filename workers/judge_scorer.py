"""JudgeScorer: the reward worker's LLM judge (``roles.reward.judge``): a frozen causal LM that writes a verdict on
each sample, parsed to its score.

The reward worker builds it in ``init_model`` (the model placed on the role's device with the role's strategy, as
the reference policy is) and calls :meth:`JudgeScorer.score` from ``compute_rewards``: render each sample's judge
prompt (:mod:`rlhfctl.rewards.judge`), generate with the hf engine's decoding loop
(:func:`rlhfctl.rollout.generation.generate_batch`, greedy at ``judge.temperature: 0``), parse the verdicts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from rlhfctl.engine.placement import serving
from rlhfctl.engine.seeding import make_generator
from rlhfctl.models.loading import load_causal_lm, load_tokenizer
from rlhfctl.protocol import DataProto
from rlhfctl.rewards.judge import JudgeScores, load_parser, parse_verdicts, render_prompt
from rlhfctl.rollout.generation import SamplingParams, eos_token_ids, generate_batch

__all__ = ["JUDGE_PARSE_ERROR_COLUMN", "JUDGE_VERDICT_COLUMN", "JudgeScorer"]

JUDGE_VERDICT_COLUMN = "judge_verdict"
"""The non-tensor column holding each sample's verdict (the samples log writes it beside the sample)."""
JUDGE_PARSE_ERROR_COLUMN = "judge_parse_error"
"""The non-tensor column marking the verdicts that did not parse (summed into ``reward/judge_parse_errors``)."""


class JudgeScorer:
    """One reward rank's judge: :meth:`load` once, then :meth:`score` per ``compute_rewards`` call."""

    def __init__(self, settings: Mapping[str, Any], role: str = "reward") -> None:
        self.settings = settings
        self.role = role
        self.parser = load_parser(str(settings["parser"]), settings["score_range"], f"roles.{role}.judge.parser")
        self.model: nn.Module | None = None
        self.tokenizer: Any = None
        self.worker: Any = None  # the reward worker: its device, rank, seed and placement settings
        self.calls = 0

    def load(self, worker: Any) -> None:
        """Build the judge's tokenizer and frozen model with ``worker``'s placement (its device and strategy)."""
        model_cfg = self.settings["model"]
        trust = bool(model_cfg["trust_remote_code"])
        self.tokenizer = load_tokenizer(model_cfg, trust_remote_code=trust)

        def build(cfg: Mapping[str, Any]) -> nn.Module:
            model = load_causal_lm(cfg, self.tokenizer, dtype=worker.engine.storage_dtype, trust_remote_code=trust,
                                   seed=worker.seed)
            return model.requires_grad_(False)

        # Frozen: weights stored in model.dtype, sharded under roles.reward.strategy fsdp2 (gathered to generate).
        self.model, _ = worker._place_model(build, model_cfg, trainable=False)
        self.model.eval()
        self.worker = worker

    def score(self, prompts: Sequence[str], responses: Sequence[str], references: Sequence[str]) -> JudgeScores:
        """The judge's verdict on each (prompt, response, reference) and the score it parses to."""
        if self.model is None:
            raise RuntimeError(f"the judge of roles.{self.role}: call load() first")
        settings = self.settings
        texts = [render_prompt(settings["template"], prompt=str(prompt), response=str(response),
                               reference=str(reference), rubric=str(settings["rubric"]))
                 for prompt, response, reference in zip(prompts, responses, references)]
        size = int(settings["batch_size"] or max(len(texts), 1))
        verdicts: list[str] = []
        # One gather of FSDP2's shards for the whole call (a collective): every rank enters it once, whatever its rows.
        with serving(self.model, self.worker.engine):
            for start in range(0, len(texts), size):
                verdicts += self.generate(texts[start:start + size])
        return parse_verdicts(verdicts, self.parser, settings["score_range"], float(settings["parse_error_score"]),
                              str(settings["parser"]))

    @torch.no_grad()
    def generate(self, texts: Sequence[str]) -> list[str]:
        """The judge's verdicts on ``texts`` (rendered judge prompts), by the hf engine's decoding loop (inside
        :func:`~rlhfctl.engine.placement.serving`, which :meth:`score` enters)."""
        if not texts:
            return []
        temperature = float(self.settings["temperature"])
        params = SamplingParams(n=1, max_new_tokens=int(self.settings["max_new_tokens"]), temperature=temperature,
                                top_p=1.0, top_k=0, do_sample=temperature > 0)
        worker = self.worker
        generator = make_generator(worker.device, worker.seed, worker.rank, "judge", self.calls)
        self.calls += 1
        generated = generate_batch(self.model, self.tokenizer, self._encode(texts), params, device=worker.device,
                                   generator=generator)
        return [str(text) for text in generated.non_tensor_batch["response_text"].tolist()]

    def _encode(self, texts: Sequence[str]) -> DataProto:
        """Left-padded judge prompts (through the chat template where it applies; the last ``max_prompt_length``
        tokens of a longer one)."""
        tokenizer = self.tokenizer
        chat = self.settings["apply_chat_template"]
        if chat is None:
            chat = bool(getattr(tokenizer, "chat_template", None))
        if chat:
            texts = [tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                   tokenize=False) for text in texts]
        limit = self.settings["max_prompt_length"]
        rows = [list(tokenizer(text, add_special_tokens=not chat)["input_ids"]) for text in texts]
        rows = [row[-int(limit):] if limit else row for row in rows]
        width = max(len(row) for row in rows)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_token_ids(tokenizer, self.model)[0]
        ids = torch.full((len(rows), width), int(pad), dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for index, row in enumerate(rows):
            if row:
                ids[index, width - len(row):] = torch.tensor(row, dtype=torch.long)
                mask[index, width - len(row):] = 1
        return DataProto.from_dict(tensors={"input_ids": ids, "attention_mask": mask})

    def columns(self, judged: JudgeScores) -> dict[str, Any]:
        """The non-tensor columns ``compute_rewards`` adds: each verdict and whether it failed to parse."""
        verdicts = np.empty(len(judged.verdicts), dtype=object)
        verdicts[:] = judged.verdicts
        return {JUDGE_VERDICT_COLUMN: verdicts, JUDGE_PARSE_ERROR_COLUMN: np.asarray(judged.parse_errors, dtype=bool)}
