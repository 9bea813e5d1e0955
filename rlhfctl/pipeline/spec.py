"""The parsed pipeline file: an output directory and stages, each a recipe plus overrides."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlhfctl.recipe.stages import MODEL_DIR

__all__ = ["COMPLETE_MARKER", "MODEL_DIR", "STAGE_ATTRIBUTES", "PipelineSpec", "StageSpec"]

COMPLETE_MARKER = "COMPLETE"
"""Written last into a stage's directory; a stage that has it is skipped on rerun."""
STAGE_ATTRIBUTES = {
    "output": "the stage's model directory, <output_dir>/<stage>/model (what model.path takes)",
    "dir": "the stage's directory, <output_dir>/<stage>",
    "metrics": "the stage's metrics file, <output_dir>/<stage>/metrics.jsonl",
}
"""What ``${stages.<name>.<attribute>}`` may name."""


@dataclass
class StageSpec:
    """One stage: a recipe (a file, or an inline mapping) and the overrides applied on top of it."""

    name: str
    recipe: str | dict[str, Any]
    overrides: list[str] = field(default_factory=list)
    recipe_path: Path | None = None
    """The recipe file, resolved (None for an inline recipe)."""

    def describe_recipe(self) -> str:
        """The recipe file, or "inline"."""
        return str(self.recipe_path) if self.recipe_path is not None else "inline"


@dataclass
class PipelineSpec:
    """A whole pipeline: where it writes, and its stages in order."""

    output_dir: Path
    stages: list[StageSpec]
    source: str = "<pipeline>"

    def stage_dir(self, name: str) -> Path:
        """``<output_dir>/<name>``."""
        return self.output_dir / name

    def attributes(self, name: str) -> dict[str, str]:
        """The values ``${stages.<name>.*}`` stands for."""
        directory = self.stage_dir(name)
        return {"output": str(directory / MODEL_DIR), "dir": str(directory), "metrics": str(directory / "metrics.jsonl")}

    def names(self) -> list[str]:
        """Stage names in order."""
        return [stage.name for stage in self.stages]
