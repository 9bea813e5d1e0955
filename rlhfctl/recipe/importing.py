"""Import the classes and functions a recipe names (``worker:``, ``function:``) without calling them."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from rlhfctl.recipe.errors import RecipeError, did_you_mean

__all__ = ["ensure_cwd_importable", "import_class", "import_python_file"]


def ensure_cwd_importable() -> None:
    """Let recipes name modules in the working directory (the console script does not put it on sys.path)."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)


def _import_failure(key_path: str, ref: str, error: BaseException) -> RecipeError:
    detail = str(error).splitlines()[0] if str(error) else ""
    reason = f"{type(error).__name__}: {detail}" if detail else type(error).__name__
    return RecipeError(f"{key_path}: cannot import {ref!r}: {reason}", key_path=key_path, kind="import")


def _split(ref: str, key_path: str, example: str) -> tuple[str, str]:
    if ":" in ref:
        module, _, attr = ref.rpartition(":")
    else:
        module, _, attr = ref.rpartition(".")
    if not module or not attr:
        raise RecipeError(f"{key_path}: {ref!r} is not an import reference like {example}", key_path=key_path, kind="import")
    return module, attr


def _import_module(module: str) -> Any:
    ensure_cwd_importable()
    if module.endswith(".py"):
        return import_python_file(Path(os.path.expanduser(module)))
    return importlib.import_module(module)


def import_python_file(path: Path, prefix: str = "rlhfctl_user") -> ModuleType:
    """Import a user's ``.py`` file once per path (recipes and reward functions name files, not packages).

    Raises FileNotFoundError, ImportError, or whatever the file raises while it runs (then it is not cached).
    """
    path = path if path.is_absolute() else Path.cwd() / path
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:10]
    name = f"{prefix}_{path.stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _resolve(ref: str, key_path: str, example: str) -> Any:
    module_name, attr = _split(ref, key_path, example)
    try:
        module = _import_module(module_name)
    except (Exception, SystemExit) as error:  # user code may fail in any way at import time
        raise _import_failure(key_path, ref, error) from None
    if not hasattr(module, attr):
        found = sorted(name for name in vars(module) if not name.startswith("_"))
        raise RecipeError(
            f"{key_path}: cannot import {ref!r}: module {module_name!r} has no attribute {attr!r}{did_you_mean(attr, found)}",
            key_path=key_path,
            kind="import",
        )
    return getattr(module, attr)


def import_class(ref: str, key_path: str) -> type:
    """The class named by ``pkg.module.Class`` or ``pkg.module:Class``; RecipeError naming ``key_path`` otherwise."""
    value = _resolve(ref, key_path, "pkg.module.Class")
    if not isinstance(value, type):
        raise RecipeError(f"{key_path}: {ref!r} is a {type(value).__name__}, not a class", key_path=key_path, kind="import")
    return value
