"""What ``rlhfctl validate`` lists of the tasks a recipe generates its prompts from (``data.task`` or ``data.tasks``):
each task's name, ``data_source``, weight, how many prompts each split gets and its first training prompt."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from rlhfctl.recipe.specs import Recipe

__all__ = ["TaskListing", "task_listing"]


@dataclass(frozen=True)
class TaskListing:
    """One task of the recipe's prompts, with the size of each split and an example prompt."""

    key: str
    """Where the recipe names it: ``data.task`` or ``data.tasks[<i>]``."""
    name: str
    data_source: str | None
    """The records' ``data_source`` (per-source metrics are named by it), None when the task sets none."""
    weight: float | None
    """Its weight in a mixture (None: the only task)."""
    train: int
    val: int
    example: str
    """Its first training prompt, as generated (before any chat template)."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly view."""
        return asdict(self)


def task_listing(recipe: Recipe) -> list[TaskListing]:
    """The recipe's tasks (empty with data files, or when a task cannot be generated: the checks report why)."""
    data = recipe.data
    if data.train_files or not (data.task or data.tasks):
        return []
    # the trainer's own seeds and counts; importing the tasks and the prompt source pulls in torch: only here
    from rlhfctl.tasks import UnknownTaskError, get_task, mixture
    from rlhfctl.trainer.prompt_source import task_split

    (num_train, seed), (num_val, _) = task_split(recipe, "train"), task_split(recipe, "val")
    if recipe.stage is None and not recipe.trainer.val_every:
        num_val = 0  # a ppo-family run generates validation prompts only to validate
    if data.tasks:
        members = [(str(entry.get("name")), entry.get("weight", 1.0)) for entry in data.tasks]
        try:
            weights = [float(weight) for _, weight in members]
            trains, vals = mixture.apportion(num_train, weights), mixture.apportion(num_val, weights)
        except (TypeError, ValueError):
            return []  # check_tasks reports the bad weight
        named = [(f"data.tasks[{index}]", name, weight) for index, ((name, _), weight) in enumerate(zip(members, weights))]
    else:
        named, trains, vals = [("data.task", str(data.task), None)], [num_train], [num_val]
    listing = []
    for (key, name, weight), train, val in zip(named, trains, vals):
        try:
            first = get_task(name).make_prompts(1, seed)[0]
        except UnknownTaskError:
            return []
        source = first.get("data_source")
        listing.append(TaskListing(key, name, None if source is None else str(source), weight, train, val,
                                   str(first.get(str(data.prompt_key), ""))))
    return listing
