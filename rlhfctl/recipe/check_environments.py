"""Validation of ``rollout.environment``: the key names a known kind and is not doubled by
``rollout.multi_turn.environment``, then the kind's own checks (its extra installed, its client importing, the
adapter building from its config, the server answering), before any worker starts (exit 2 from ``validate`` and
``train``).

The checks read the choice that resolve made (``recipe.rollout.environment``); each kind supplies its checks through
the registry (``rlhfctl/environments/kinds.py``), so a new kind needs nothing here.
"""

from __future__ import annotations

from rlhfctl.recipe.errors import Issue, RecipeError, error, warning
from rlhfctl.recipe.specs import Recipe

__all__ = ["check_environments"]

_KEY = "rollout.environment"


def check_environments(recipe: Recipe) -> list[Issue]:
    """The first problem of ``rollout.environment`` as one error naming its key; a warning for an
    ``environment_config`` nothing reads; nothing without the key."""
    choice = recipe.rollout.environment
    if choice is None:
        if recipe.rollout.settings.environment_config:
            return [warning(f"{_KEY}_config", f"{_KEY}_config is set but {_KEY} is not: nothing reads it")]
        return []
    if choice.problem is not None:
        return [error(_KEY, choice.problem)]
    # the registry: imported only when a recipe names an environment
    from rlhfctl.environments.kinds import ENVIRONMENT_KINDS

    config = choice.adapter_config
    for check in ENVIRONMENT_KINDS[choice.kind].checks:
        try:
            check(config)
        except RecipeError as problem:
            return [error(problem.key_path or _KEY, str(problem))]
    return []
