"""Which policy a command was pointed at, and the recipe that goes with it.

``rlhfctl eval`` and ``rlhfctl generate`` take a run directory (its newest complete checkpoint), a checkpoint
directory (``checkpoints/step_N``), a Hugging Face directory (a run's ``model/`` export or any other), or a hub id.
A run's own ``recipe.yaml`` says how the policy was built and rewarded; ``--recipe`` names another one, and is
needed where there is no run around the policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rlhfctl.recipe.errors import RecipeError
from rlhfctl.trainer import checkpoint

__all__ = ["PolicySource", "find_policy"]

RUN_RECIPE = "recipe.yaml"
"""The recipe a run saves beside its checkpoints (``TrainerBase.setup``)."""


@dataclass(frozen=True)
class PolicySource:
    """A policy to load: the recipe that builds and rewards it, and a checkpoint or a model path to load."""

    recipe: str
    """A recipe file, or a bundled recipe's name."""
    checkpoint: Path | None
    """A complete ``checkpoints/step_N`` to load into the actor, or None."""
    model_path: str | None
    """A Hugging Face directory or hub id that becomes ``roles.actor.model.path``, or None."""
    step: int
    """The policy's training step (0 when unknown): the validation key, so samples match the run's ``val/*``."""

    @property
    def label(self) -> str:
        """How reports name the policy."""
        return str(self.checkpoint if self.checkpoint is not None else self.model_path)


def find_policy(target: str, recipe: str | None = None) -> PolicySource:
    """The policy ``target`` names (see the module doc); ``recipe`` overrides the run's own recipe."""
    path = Path(target).expanduser()
    if not path.exists():
        if _looks_like_hub_id(target):
            return PolicySource(_required_recipe(recipe, target), None, target, 0)
        raise RecipeError(f"{target}: no such run, checkpoint or model directory (nor a hub id like org/name)",
                          kind="file_not_found")
    if not path.is_dir():
        raise RecipeError(f"{target}: expected a run, checkpoint or model directory, found a file", kind="file_not_found")
    if (path / checkpoint.STATE_FILE).is_file():
        return _checkpoint_source(path, recipe, path.parent.parent)
    if (path / RUN_RECIPE).is_file() and checkpoint.checkpoint_root(path).is_dir():
        latest = checkpoint.read_latest(path)
        if latest is None:
            raise RecipeError(f"{target}: the run has no complete checkpoint in {checkpoint.checkpoint_root(path)}; "
                              "point at its exported model directory instead, or train with trainer.save_every set",
                              kind="file_not_found")
        return _checkpoint_source(latest, recipe, path)
    if (path / "config.json").is_file():
        beside = path.parent / RUN_RECIPE
        chosen = recipe or (str(beside) if beside.is_file() else None)
        return PolicySource(_required_recipe(chosen, target), None, str(path.resolve()), 0)
    raise RecipeError(f"{target}: not a run (recipe.yaml and checkpoints/), a checkpoint ({checkpoint.STATE_FILE}) "
                      "or a Hugging Face model directory (config.json)", kind="file_not_found")


def _checkpoint_source(directory: Path, recipe: str | None, run: Path) -> PolicySource:
    missing = checkpoint.missing_parts(directory)
    if missing:
        raise RecipeError(f"{directory}: not a complete checkpoint (missing or cut short: {', '.join(missing[:5])}); "
                          "point at the run directory for its newest complete one", kind="file_not_found")
    chosen = recipe or (str(run / RUN_RECIPE) if (run / RUN_RECIPE).is_file() else None)
    return PolicySource(_required_recipe(chosen, str(directory)), directory, None, checkpoint.checkpoint_step(directory))


def _required_recipe(recipe: str | None, target: str) -> str:
    if recipe is None:
        raise RecipeError(f"{target}: no run recipe.yaml beside it; name the recipe that builds and rewards the policy "
                          "with --recipe (a file or a bundled name)", key_path="--recipe", kind="missing")
    return recipe


def _looks_like_hub_id(target: str) -> bool:
    parts = target.split("/")
    return len(parts) == 2 and all(parts) and not target.startswith((".", "~"))
