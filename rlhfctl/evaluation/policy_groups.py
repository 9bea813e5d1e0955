"""The recipe of an evaluation or generation run, and its worker groups started with the policy loaded.

Only the roles the command needs start (the actor, and the reward for ``eval``), on the recipe's pools or the local
backend; generation runs on the actor (``rollout.placement`` colocated: nothing trains, so nothing needs a pool of
its own), with the recipe's engine. The groups are the training's own: the same workers, rollout and reward code.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rlhfctl.evaluation.policy_source import PolicySource
from rlhfctl.recipe.bundled import bundled_path
from rlhfctl.recipe.errors import RecipeError
from rlhfctl.recipe.load import read_recipe_file, recipe_from_dict
from rlhfctl.recipe.specs import Recipe

__all__ = ["inference_config", "policy_groups"]


def _recipe_file(recipe: str) -> Path:
    path = Path(recipe).expanduser()
    if path.is_file():
        return path
    found = bundled_path(recipe)
    if found is None:
        raise RecipeError(f"--recipe: {recipe} is neither a recipe file nor a bundled recipe (rlhfctl recipes list)",
                          key_path="--recipe", kind="file_not_found")
    return found


def inference_config(source: PolicySource, overrides: Sequence[str], roles: Sequence[str],
                     val_files: Sequence[str] = ()) -> DictConfig:
    """``source``'s recipe with ``overrides``, keeping only ``roles``, generating on the actor; the policy's model
    path and ``val_files`` (the prompts, when given) filled in."""
    cfg = recipe_from_dict(read_recipe_file(_recipe_file(source.recipe)), list(overrides))
    data: dict[str, Any] = OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
    missing = [role for role in roles if role not in data["roles"]]
    if missing:
        raise RecipeError(f"roles.{missing[0]}: the recipe {source.recipe} declares no {missing[0]} role, which this "
                          "command needs", key_path=f"roles.{missing[0]}", kind="missing")
    data["roles"] = {role: spec for role, spec in data["roles"].items() if role in roles}
    data["rollout"]["placement"] = "colocated"
    data["trainer"]["resume"] = "never"
    if source.model_path is not None:
        model = data["roles"]["actor"].setdefault("model", {})
        model["path"], model["config"] = source.model_path, None  # the directory says the architecture
    if val_files:
        data["data"]["val_files"] = list(val_files)
    return recipe_from_dict(data)


@contextmanager
def policy_groups(recipe: Recipe, checkpoint: Path | None) -> Iterator[Any]:
    """The recipe's worker groups, built, with ``checkpoint`` loaded into the actor; stopped (and a Ray started here
    shut down) on the way out, whatever happens."""
    # torch and ray: only once a command runs, off the CLI's fast path
    from rlhfctl.ray_cluster import start_or_join_ray
    from rlhfctl.run_signals import stop_on_signals
    from rlhfctl.trainer.role_groups import build_role_groups

    session = None
    if recipe.ray.backend == "ray":
        session = start_or_join_ray(address=recipe.ray.address, num_cpus=recipe.ray.num_cpus,
                                    num_gpus=recipe.ray.num_gpus, dashboard=bool(recipe.ray.dashboard))
    groups = None
    try:
        with stop_on_signals():
            groups = build_role_groups(recipe, call_timeout_s=recipe.trainer.call_timeout_s)
            for future in [group.init_model.submit() for group in groups.all()]:
                future.get()
            if checkpoint is not None:
                groups["actor"].load_checkpoint(str(checkpoint))
            yield groups
    finally:
        if groups is not None:
            groups.shutdown()
        if session is not None:
            session.shutdown()
