"""Every module of rlhfctl and workers, and every name in every package's ``__all__``, imports as the first thing a
fresh interpreter asks for.

Which of our modules loads first decides the order of the rest, and a circle between them fails only for some
first imports (``import rlhfctl.algorithms as a; a.gae_advantages`` did): the suite's own order hides that. So each
import runs in a child forked from a parent that holds the third-party libraries (torch, transformers, Ray, ...)
and none of ours: as fresh as a new interpreter for our modules, at the cost of a fork (issue 37).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("rlhfctl", "workers")
THIRD_PARTY = ("numpy", "torch", "torch.distributed", "transformers", "peft", "safetensors", "omegaconf", "ray",
               "typer", "rich", "pyarrow", "jsonschema")


def modules() -> list[str]:
    """Every module under the packages, by its dotted name, from the files (nothing imported)."""
    names = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def packages() -> list[str]:
    """Every package under ours, by its dotted name."""
    return [".".join(init.relative_to(ROOT).parts[:-1]) for package in PACKAGES for init in sorted((ROOT / package).rglob("__init__.py"))]


def _in_child(work) -> str:
    """``work()``'s text (or its error) from a child forked from this process: our modules load afresh there."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            message = work().encode()
        except BaseException:  # noqa: BLE001 - reported to the parent
            message = ("error: " + traceback.format_exc(limit=-3)).encode()
        os.write(write, message[-60000:])
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        output = pipe.read()
    os.waitpid(pid, 0)
    return output.decode()


def exported_names() -> list[tuple[str, str]]:
    """``(package, name)`` for each name of each package's ``__all__`` (each package read in a child of its own)."""
    import importlib

    pairs = []
    for package in packages():
        text = _in_child(lambda: json.dumps(list(getattr(importlib.import_module(package), "__all__", []))))
        if text.startswith("error: "):
            raise AssertionError(f"import {package}: {text}")
        pairs += [(package, name) for name in json.loads(text)]
    return pairs


def _first_import_fails(target: str, name: str | None) -> str | None:
    """Import ``target`` (and get ``name`` from it) as the first of our imports; the error, or None."""
    import importlib

    def work() -> str:
        module = importlib.import_module(target)
        if name is not None:
            getattr(module, name)
        return ""

    return _in_child(work) or None


def first_import_failures() -> list[str]:
    """Run in a fresh interpreter: load the third-party libraries, then try each of ours in a forked child."""
    for library in THIRD_PARTY:
        __import__(library)
    assert not [name for name in sys.modules if name.split(".")[0] in PACKAGES], "our packages loaded too early"
    failures = [f"import {module}: {error}" for module in modules() if (error := _first_import_fails(module, None))]
    names = exported_names()
    failures += [f"{package}.{name}: {error}" for package, name in names if (error := _first_import_fails(package, name))]
    return [f"checked {len(modules())} modules and {len(names)} exported names"] + failures


def test_every_module_and_exported_name_imports_first():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, __file__], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    counts, *failures = json.loads(done.stdout.splitlines()[-1])
    checked = [int(word) for word in counts.split() if word.isdigit()]
    assert checked[0] > 150 and checked[1] > 100, counts  # the walk found the packages and their exports
    assert failures == [], "\n\n".join(failures)


if __name__ == "__main__":
    print(json.dumps(first_import_failures()))
