"""``trainer.loggers``: the names a recipe may list, the extra each optional one needs, and the check before launch."""

from __future__ import annotations

import importlib.util
from typing import Any

from rlhfctl.recipe.report import Issue, error

__all__ = ["LOGGER_EXTRAS", "LOGGER_NAMES", "check_loggers", "listed_loggers"]

#: The loggers a recipe may list, in the order they are written.
LOGGER_NAMES: tuple[str, ...] = ("console", "jsonl", "tensorboard", "wandb", "mlflow")
#: logger -> (module it imports, the pip extra that installs it)
LOGGER_EXTRAS: dict[str, tuple[str, str]] = {
    "tensorboard": ("tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb"),
    "mlflow": ("mlflow", "mlflow"),
}


def check_loggers(cfg: Any) -> list[Issue]:
    """Errors for unknown names in ``trainer.loggers`` and for loggers whose package is not installed."""
    names = list(listed_loggers(cfg))
    issues = []
    for position, name in enumerate(names):
        key = f"trainer.loggers[{position}]"
        if name not in LOGGER_NAMES:
            issues.append(error(key, f"{key}: {name!r} is not one of: {', '.join(LOGGER_NAMES)}"))
        elif name in LOGGER_EXTRAS and importlib.util.find_spec(LOGGER_EXTRAS[name][0]) is None:
            module, extra = LOGGER_EXTRAS[name]
            issues.append(error(key, f"{key}: the {name} logger needs the {module!r} package, which is not installed; "
                                     f"pip install 'rlhfctl[{extra}]' or remove {name} from trainer.loggers"))
    return issues


def listed_loggers(cfg: Any) -> list[str]:
    """The names in ``trainer.loggers`` of a merged recipe (or its plain dict); null lists none."""
    trainer = cfg["trainer"] if isinstance(cfg, dict) else cfg.trainer
    return [str(name) for name in trainer.get("loggers") or []]
