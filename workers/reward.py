"""RewardWorker: scores responses with a reward function or a sequence-classification model."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from rlhfctl.algorithms.overlong import overlong_buffer_problem, overlong_penalty
from rlhfctl.models.loading import load_sequence_classifier, load_tokenizer
from rlhfctl.protocol import DataProto
from rlhfctl.recipe.errors import RecipeError
from rlhfctl.single_controller import Dispatch, rank_progress, register
from rlhfctl.tasks import get_task
from rlhfctl.tasks.reward_fn import named_score_column
from rlhfctl.engine.placement import forwards_are_collective, scoring
from rlhfctl.engine.micro_batches import scoring_slices
from rlhfctl.engine.offload import on_device
from rlhfctl.engine.packing import packed_sequence_scores
from rlhfctl.rewards.remote_service import RemoteRewardClient, remote_meta_info
from rlhfctl.rewards.functions import (
    INTERNAL_COLUMNS,
    is_internal_column,
    CONVERSATION_COLUMNS,
    ON_ERROR_POLICIES,
    RewardFunctionError,
    RewardOutputError,
    RewardScores,
    call_reward_function,
    conversation_columns_taken,
    load_reward_function,
)
from workers.judge_scorer import JudgeScorer
from workers.role import RoleWorker

__all__ = ["INTERNAL_COLUMNS", "OVERLONG_PENALTY", "RewardWorker", "is_internal_column", "place_scores"]

OVERLONG_PENALTY = "overlong_penalty"
"""The named score holding DAPO's overlong penalty (column ``reward/overlong_penalty``) when the buffer is on."""


def place_scores(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """(B, R) zeros with each score at the last token of the loss mask (column 0 for an empty response).

    The last mask-1 position, not ``mask.sum() - 1``: an agent rollout's mask has holes (tool outputs are 0),
    and a score placed on a mask-0 token would be dropped by GAE and the KL shaping. For a prefix mask the
    two are the same column.
    """
    rows, width = response_mask.shape
    columns = torch.arange(1, width + 1, device=response_mask.device)
    last = ((response_mask != 0).long() * columns).max(dim=-1).values - 1 if width else torch.zeros(rows, dtype=torch.long)
    last = last.clamp(min=0, max=max(width - 1, 0))
    placed = torch.zeros(rows, width, dtype=torch.float32)
    placed[torch.arange(rows), last] = scores.float()
    return placed


class RewardWorker(RoleWorker):
    """Reward role: ``roles.reward.function`` (``module:function`` or ``file.py:function``), or
    ``roles.reward.model`` (a sequence classifier), or else the bundled ``data.task``'s reward."""

    default_role = "reward"

    def __init__(self, recipe: Mapping[str, Any], role: str = "reward") -> None:
        super().__init__(recipe, role)
        self.config = self.spec.settings
        if self.config["on_error"] not in ON_ERROR_POLICIES:
            raise RecipeError(
                f"roles.{self.role}.on_error must be one of {ON_ERROR_POLICIES}, got {self.config['on_error']!r}"
            )
        self.overlong = dict(self.config.overlong_buffer)
        self.max_new_tokens = self.recipe.rollout.response_width  # the response's columns
        problem = overlong_buffer_problem(self.overlong, self.max_new_tokens)
        if problem:
            raise RecipeError(problem, "roles.reward.overlong_buffer.len", "out_of_range")
        self.function_kwargs = dict(self.config.function_kwargs)
        self.score_names: list[str] = []  # the named scores the function last returned (for a batch that all fails)
        self.function: Callable[..., Any] | None = None
        self.remote: RemoteRewardClient | None = None  # roles.reward.remote: a service scores, function is ignored
        self.function_name = ""
        self.model: nn.Module | None = None
        self.model_tokenizer: Any = None
        self.judge: JudgeScorer | None = None  # roles.reward.judge: an LLM judge scores (wins over function and model)
        self._ready = False

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    @on_device
    def init_model(self) -> None:
        """Load the reward function, or the reward model and its tokenizer, or the judge, or the remote service's client."""
        self._setup_process(distributed=False)
        spec = self.config.get("function")
        if self.config.get("judge"):
            self.judge = JudgeScorer(self.config["judge"], self.role)
            self.judge.load(self)
        elif self.config.get("remote") is not None:
            self.remote = RemoteRewardClient.from_config(self.config["remote"])
            self.function_name = f"remote reward service {self.remote.url}"
        elif spec:
            self.function = load_reward_function(spec)
            self.function_name = str(spec)
        elif self.config.get("model"):
            self._load_model()
        else:
            task = self.recipe.data.task
            if not task:
                raise RewardFunctionError(
                    f"roles.{self.role} needs 'function' ('module:function' or 'path/to/file.py:function') "
                    "or 'model' (a sequence-classification reward model), or data.task for a bundled task"
                )
            self.function = get_task(str(task)).score
            self.function_name = f"task {task!r}"
        self._ready = True

    def _load_model(self) -> None:
        model_cfg = self.spec.model
        trust = bool(model_cfg["trust_remote_code"])
        self.model_tokenizer = load_tokenizer(model_cfg, trust_remote_code=trust)
        self.model_tokenizer.padding_side = "right"

        def build(cfg: Mapping[str, Any]) -> nn.Module:
            model = load_sequence_classifier(
                cfg, self.model_tokenizer, dtype=self.engine.storage_dtype, trust_remote_code=trust, seed=self.seed
            )
            return model.requires_grad_(False)

        # Frozen: weights stored in model.dtype, sharded under roles.reward.strategy fsdp2.
        self.model, _ = self._place_model(build, model_cfg, trainable=False)
        self.model.eval()

    def _policy_tokenizer(self) -> Any:
        """The actor's tokenizer, loaded on first use, to decode prompts/responses given only as ids."""
        if self.tokenizer is None:
            actor_model = self.recipe.role("actor").model
            self.tokenizer = load_tokenizer(actor_model, trust_remote_code=bool(actor_model["trust_remote_code"]))
        return self.tokenizer

    def _texts(self, data: DataProto, column: str, tensor: str, mask: torch.Tensor | None) -> list[str]:
        if column in data.non_tensor_batch:
            return [str(text) for text in data.non_tensor_batch[column].tolist()]
        if tensor not in data.batch:
            raise KeyError(f"compute_rewards needs non-tensor '{column}' or tensor '{tensor}'; got {data.keys()}")
        ids = data.batch[tensor]
        if mask is None:
            mask = torch.ones_like(ids)
        tokenizer = self._policy_tokenizer()
        return [tokenizer.decode(row[keep.bool()].tolist(), skip_special_tokens=True) for row, keep in zip(ids, mask)]

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    @on_device
    def compute_rewards(self, data: DataProto) -> DataProto:
        """``token_level_scores`` (B, R) with the reward at the last valid response token, plus non-tensor
        ``score`` (the function's or model's raw score, float), ``reward_error`` (True where on_error=zero
        replaced a failure) and one float column ``reward/<name>`` per named score (``reward/overlong_penalty``
        with the overlong buffer, whose penalty the reward adds to ``score``); ``meta_info['reward/errors']``
        counts the failures on this rank. With ``roles.reward.judge``: ``judge_verdict`` (the judge's text) and
        ``judge_parse_error`` (True where it did not parse and scored ``judge.parse_error_score``)."""
        if not self._ready:
            raise RuntimeError(f"{type(self).__name__} ({self.role}): call init_model() first")
        self._require_keys(data, ("responses",), "compute_rewards")
        responses = data.batch["responses"]
        response_mask = data.batch.get("response_mask")
        if response_mask is None:
            response_mask = data.batch["attention_mask"][:, -responses.shape[1] :]
        prompt_mask = None
        if "prompts" in data.batch and "attention_mask" in data.batch:
            prompt_mask = data.batch["attention_mask"][:, : data.batch["prompts"].shape[1]]
        prompts = self._texts(data, "prompt_text", "prompts", prompt_mask)
        # The response's real tokens are the attention mask over it (tool outputs too); response_mask is the loss's.
        real = data.batch["attention_mask"][:, -responses.shape[1]:] if "attention_mask" in data.batch else response_mask
        texts = self._texts(data, "response_text", "responses", real)
        scorer_columns: dict[str, Any] = {}  # a judge's or remote service's own per-sample columns
        if self.judge is not None:
            references = data.non_tensor_batch.get("ground_truth", [""] * len(texts))
            verdicts = self.judge.score(prompts, texts, ["" if ref is None else str(ref) for ref in references])
            result, scorer_columns = RewardScores(verdicts.scores, [False] * len(texts), {}), self.judge.columns(verdicts)
        elif self.remote is not None:  # no on_error: a service that stays down stops the step (exit 3)
            remote = self.remote.score(prompts, texts, data.non_tensor_batch)
            result, scorer_columns = RewardScores(remote.scores, [False] * len(texts), remote.named), remote.columns()
        elif self.function is not None:
            result = self._function_scores(data, prompts, texts)
        else:
            scores = self._model_scores(self._model_prompts(data, prompts), texts)
            result = RewardScores(scores, [False] * len(texts), {})
        rewards = torch.tensor(result.scores, dtype=torch.float32)
        named = dict(result.named)
        if self.overlong["enable"]:
            penalty = self._overlong_penalty(data, response_mask, named)
            rewards = rewards + penalty
            named[OVERLONG_PENALTY] = penalty.tolist()
        return DataProto.from_dict(
            tensors={"token_level_scores": place_scores(rewards, response_mask)},
            non_tensors={
                "score": np.asarray(result.scores, dtype=np.float64),
                "reward_error": np.asarray(result.errored, dtype=bool),
                **{named_score_column(key): np.asarray(values, dtype=np.float64) for key, values in named.items()},
                **scorer_columns,
            },
            meta_info={"reward/errors": int(sum(result.errored)), **remote_meta_info(scorer_columns)},
        )

    def _function_scores(self, data: DataProto, prompts: list[str], texts: list[str]) -> RewardScores:
        """The reward function's scores, with the data columns and ``function_kwargs`` as keywords."""
        columns = {key: values.tolist() for key, values in data.non_tensor_batch.items() if not is_internal_column(key)}
        taken = conversation_columns_taken(self.function, list(columns))
        columns = {key: values for key, values in columns.items() if key not in CONVERSATION_COLUMNS or key in taken}
        result = call_reward_function(
            self.function,
            self.function_name,
            prompts,
            texts,
            columns,
            kwargs=self.function_kwargs,
            batch_size=self.config["batch_size"],
            on_error=str(self.config["on_error"]),
            names=self.score_names,
        )
        self.score_names = list(result.named) or self.score_names
        return result

    def _overlong_penalty(self, data: DataProto, response_mask: torch.Tensor, named: Mapping[str, Any]) -> torch.Tensor:
        """DAPO's penalty of each response, its length counted as verl's ``valid_response_length`` counts it: the
        attention mask over the response (every generated token up to and including EOS), else ``response_mask``."""
        if OVERLONG_PENALTY in named:
            raise RewardOutputError(
                f"reward function {self.function_name} returns a named score {OVERLONG_PENALTY!r}, the column that "
                f"roles.{self.role}.overlong_buffer writes; rename it"
            )
        width = response_mask.shape[1]
        mask = data.batch["attention_mask"][:, -width:] if "attention_mask" in data.batch else response_mask
        return overlong_penalty(
            mask.long().sum(dim=-1), self.max_new_tokens, int(self.overlong["len"]), float(self.overlong["penalty_factor"])
        )

    def _model_prompts(self, data: DataProto, policy_prompts: list[str]) -> list[str]:
        """Prompts as the reward model reads them: a chat prompt (``prompt_messages``, from
        ``data.apply_chat_template``) rendered with the reward model's own chat template when its tokenizer
        has one, as the reward-model stage trained it; otherwise the policy's prompt text."""
        chats = data.non_tensor_batch.get("prompt_messages")
        if chats is None or not getattr(self.model_tokenizer, "chat_template", None):
            return policy_prompts
        return [
            policy if chat is None else self.model_tokenizer.apply_chat_template(
                list(chat), add_generation_prompt=True, tokenize=False)
            for policy, chat in zip(policy_prompts, chats.tolist())
        ]

    @torch.no_grad()
    def _model_scores(self, prompts: list[str], responses: list[str]) -> list[float]:
        """Sequence-classifier score of prompt + response, read at the last non-pad token."""
        texts = [prompt + response for prompt, response in zip(prompts, responses)]
        scores: list[float] = []
        with scoring(self.model, self.engine):
            balance = forwards_are_collective(self.model)
            for rows, keep in scoring_slices(len(texts), self.config["batch_size"], balance=balance, device=self.device):
                encoded = self.model_tokenizer(texts[rows], padding=True, return_tensors="pt")
                encoded = {key: encoded[key].to(self.device) for key in ("input_ids", "attention_mask")}
                if self.padding_free(self.model):
                    batch_scores = packed_sequence_scores(self.model, **encoded)
                else:
                    batch_scores = self.model(**encoded).logits[:, 0]
                if keep:  # not a repeat that only keeps this rank's forward count equal to the others'
                    scores.extend(batch_scores.float().cpu().tolist())
                    rank_progress.report(len(scores), len(texts), "rows")
        return scores
