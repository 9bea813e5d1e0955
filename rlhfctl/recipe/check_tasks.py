"""Checks of ``data.tasks``, the weighted mixture of reasoning-gym tasks (``data.task`` has its choice check and
:func:`rlhfctl.recipe.check_runtime.check_data`).

- every entry is ``{name, weight}`` with a reasoning-gym task the package can generate and a weight > 0
  (the task registry's rule, :func:`rlhfctl.tasks.mixture_problems`);
- ``data.task`` and ``data.tasks`` are not both set; ``data.train_files`` wins over the mixture (a warning);
- the supervised stages (sft, reward_model, dpo) read one ``data.task``, not a mixture;
- enough prompts for a batch, and a reward function that scores the mixture's records (a warning otherwise).
"""

from __future__ import annotations

from rlhfctl.recipe.errors import Issue, error, warning
from rlhfctl.recipe.specs import Recipe

__all__ = ["MIXTURE_REWARD", "check_tasks"]

MIXTURE_REWARD = "rlhfctl.tasks.reasoning_gym:score"
"""The reward of every reasoning-gym task, and so of a mixture of them."""


def check_tasks(recipe: Recipe) -> list[Issue]:
    """Errors for unusable ``data.tasks`` entries and settings that cannot go with a mixture; warnings for ignored ones."""
    data = recipe.data
    if data.tasks is None:
        return []
    from rlhfctl.tasks import mixture_problems  # the bundled tasks import the agents' tools: only for a mixture

    issues = [error(f"data.tasks{where}", f"data.tasks{where}: {problem}") for where, problem in mixture_problems(list(data.tasks))]
    if data.task:
        issues.append(error("data.tasks", f"data.tasks: set data.task ({data.task!r}) or data.tasks, not both"))
    if data.train_files:
        return [*issues, warning("data.tasks", "data.tasks: the mixture is ignored because data.train_files is set")]
    if recipe.stage is not None:
        issues.append(error("data.tasks", (
            f"data.tasks: algorithm.name={recipe.stage} reads one data.task (or data.train_files), not a mixture; "
            "set data.task to one of the tasks")))
        return issues
    if data.num_train < recipe.trainer.batch_size:
        issues.append(error("data.num_train", (
            f"data.num_train: {data.num_train} prompts is fewer than trainer.batch_size ({recipe.trainer.batch_size})")))
    reward = recipe.section_of("reward")
    if reward is not None and reward.function and reward.function != MIXTURE_REWARD and reward.model is None:
        issues.append(warning("roles.reward.function", (
            f"roles.reward.function: {reward.function} scores the responses, not the reasoning-gym tasks' own reward "
            f"{MIXTURE_REWARD}")))
    return issues
