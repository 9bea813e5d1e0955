"""What the supervised stages (``algorithm.name``: sft, reward_model, dpo) need from a recipe.

Each stage trains one role (``StageAlgorithm.trained_role``) whose worker class must register the stage's
methods; dpo also needs a reference (``roles.reference``, or a LoRA actor whose adapter-disabled
weights are the reference). Roles a stage does not use are not started, whatever the recipe says.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from rlhfctl.recipe.errors import RecipeError
from rlhfctl.recipe.resolve import reference_source
from rlhfctl.recipe.schema import ROLE_NAMES

__all__ = ["MODEL_DIR", "STAGES", "StageAlgorithm", "check_ppo_family", "is_stage", "only_roles", "stage_roles"]

MODEL_DIR = "model"
"""Where a stage writes its Hugging Face model, under its ``trainer.output_dir``."""
_CHECKPOINT_METHODS = ("save_checkpoint", "finish_checkpoint", "load_checkpoint")


@dataclass(frozen=True)
class StageAlgorithm:
    """One supervised stage: the role it trains, the built-in worker for it, its methods and data."""

    algorithm: str
    trained_role: str
    worker: str
    methods: tuple[str, ...]
    record_kind: str


STAGES: dict[str, StageAlgorithm] = {
    "sft": StageAlgorithm("sft", "actor", "workers.sft.SFTWorker", ("init_model", "train_sft", "eval_sft", "export_hf"), "demonstrations"),
    "reward_model": StageAlgorithm(
        "reward_model",
        "reward",
        "workers.reward_model.RewardModelTrainerWorker",
        ("init_model", "train_reward_model", "eval_reward_model", "export_hf"),
        "preferences",
    ),
    "dpo": StageAlgorithm("dpo", "actor", "workers.dpo.DPOWorker", ("init_model", "train_dpo", "eval_dpo", "export_hf"), "preferences"),
}


def is_stage(cfg: Any) -> bool:
    """True when ``algorithm.name`` is a supervised stage rather than the PPO-family loop."""
    return str(cfg.algorithm.name) in STAGES


def check_ppo_family(cfg: Any, command: str) -> None:
    """Raise RecipeError (naming algorithm.name) when ``command`` only understands the PPO-family step."""
    if not is_stage(cfg):
        return
    spec = STAGES[str(cfg.algorithm.name)]
    first = spec.methods[1]
    raise RecipeError(
        f"algorithm.name: {command} describes the PPO-family step; a {spec.algorithm} recipe makes one call per step, "
        f"{spec.trained_role}.{first} (ALL_TO_ALL: each of the role's ranks trains on its shard of trainer.batch_size "
        "examples, DDP averages the gradients); see docs/pipeline.md",
        key_path="algorithm.name",
    )


def stage_roles(cfg: Any) -> dict[str, tuple[str, ...]]:
    """Role -> registered methods it needs, for the roles this stage starts (trained role first)."""
    spec = STAGES[str(cfg.algorithm.name)]
    methods = spec.methods
    if cfg.trainer.save_every or str(cfg.trainer.resume) != "never":
        methods = (*methods, *_CHECKPOINT_METHODS)
    roles = {spec.trained_role: methods}
    if spec.algorithm == "dpo":
        source = reference_source(cfg)
        if source == "reference":
            roles["reference"] = ("init_model", "compute_ref_log_prob")
        elif source == "actor":
            roles["actor"] = (*methods, "compute_ref_log_prob")
    return roles


def only_roles(cfg: Any, keep: set[str] | dict[str, Any]) -> Any:
    """A copy of the recipe in which every role outside ``keep`` is null (no group is started for it)."""
    pruned = copy.deepcopy(cfg)
    for role in ROLE_NAMES:
        if role not in keep and pruned.roles.get(role) is not None:
            pruned.roles[role] = None
    return pruned
