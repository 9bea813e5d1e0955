"""ValidationReport: the problems found in a recipe plus the derived batch table and pools."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from rlhfctl.recipe.errors import RecipeError

if TYPE_CHECKING:
    from rlhfctl.recipe.arithmetic import BatchTable
    from rlhfctl.recipe.memory_plan import MemoryPlan
    from rlhfctl.recipe.pools import PoolInfo

__all__ = ["Issue", "ValidationReport", "error", "warning"]


@dataclass(frozen=True)
class Issue:
    """One finding: ``severity`` is "error" (the run cannot work) or "warning" (it can, but check this)."""

    severity: str
    key_path: str | None
    message: str


def error(key_path: str | None, message: str) -> Issue:
    """An error issue (the message should name the key path)."""
    return Issue("error", key_path, message)


def warning(key_path: str | None, message: str) -> Issue:
    """A warning issue (the message should name the key path)."""
    return Issue("warning", key_path, message)


@dataclass
class ValidationReport:
    """Everything ``validate_recipe`` found, and what it derived (batch arithmetic, pools)."""

    issues: list[Issue] = field(default_factory=list)
    batch: "BatchTable | None" = None
    pools: "dict[str, PoolInfo]" = field(default_factory=dict)
    memory: "MemoryPlan | None" = None

    @property
    def errors(self) -> list[Issue]:
        """Issues that stop a run."""
        return [issue for issue in self.issues if issue.severity == "error"]

    @property
    def warnings(self) -> list[Issue]:
        """Issues worth a look."""
        return [issue for issue in self.issues if issue.severity == "warning"]

    @property
    def ok(self) -> bool:
        """True without errors (warnings allowed)."""
        return not self.errors

    def raise_for_errors(self) -> None:
        """Raise the first error as a RecipeError (``.key_path`` set); do nothing when ok."""
        if self.errors:
            first = self.errors[0]
            more = len(self.errors) - 1
            suffix = f" (and {more} more error{'s' if more > 1 else ''}; run rlhfctl validate)" if more else ""
            raise RecipeError(first.message + suffix, key_path=first.key_path)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly view: ok, errors, warnings, batch, pools, memory."""
        return {
            "ok": self.ok,
            "errors": [asdict(issue) for issue in self.errors],
            "warnings": [asdict(issue) for issue in self.warnings],
            "batch": None if self.batch is None else self.batch.to_dict(),
            "pools": {name: pool.to_dict() for name, pool in self.pools.items()},
            "memory": None if self.memory is None else self.memory.to_dict(),
        }
