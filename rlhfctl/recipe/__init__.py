"""Recipes: the YAML schema, loading with overrides, validation and the derived dispatch plan.

Public API::

    from rlhfctl.recipe import load_recipe, validate_recipe, resolve_pools, RecipeError
    cfg = load_recipe("recipes/quickstart.yaml", ["trainer.total_steps=10"])
    report = validate_recipe(cfg)          # ValidationReport: .errors, .warnings, .batch, .pools
    pools = resolve_pools(cfg)             # name -> PoolInfo (roles, world_size, use_gpu)
    recipe = resolve(cfg)                  # the typed, sealed Recipe the trainer and the workers read

Heavier pieces (validation, dispatch plan) are imported on first use.
"""

from __future__ import annotations

from rlhfctl.lazy_exports import lazy_exports

from rlhfctl.recipe.errors import RecipeError
from rlhfctl.recipe.load import load_recipe, recipe_from_dict
from rlhfctl.recipe.pools import PoolInfo, resolve_pools
from rlhfctl.recipe.resolve import ROLE_METHODS, present_roles, reference_source
from rlhfctl.recipe.schema import ROLE_NAMES, RecipeSchema
from rlhfctl.recipe.specs import Recipe, RoleSpec, RolloutSpec, StepFacts

__all__ = [
    "ROLE_METHODS",
    "ROLE_NAMES",
    "PoolInfo",
    "Recipe",
    "RecipeError",
    "RecipeSchema",
    "RoleSpec",
    "RolloutSpec",
    "StepFacts",
    "ValidationReport",
    "build_dispatch_plan",
    "load_recipe",
    "present_roles",
    "recipe_from_dict",
    "reference_source",
    "resolve",
    "resolve_pools",
    "training_step",
    "validate_recipe",
    "worker_classes",
]

_LAZY = {
    "resolve": "rlhfctl.recipe.resolved",
    "validate_recipe": "rlhfctl.recipe.validate",
    "ValidationReport": "rlhfctl.recipe.validate",
    "build_dispatch_plan": "rlhfctl.recipe.dispatch_plan",
    "training_step": "rlhfctl.recipe.dataflow",
    "worker_classes": "rlhfctl.recipe.check_runtime",
}


__getattr__ = lazy_exports(__name__, _LAZY)
