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


def _first_import_error(target: tuple[str, str | None]) -> str:
    """Import ``target[0]`` (and get the name ``target[1]`` from it) as the first of our imports; its error, or ""."""
    import importlib

    module, name = target
    try:
        loaded = importlib.import_module(module)
        if name is not None:
            getattr(loaded, name)
    except BaseException:  # noqa: BLE001 - reported to the parent
        return traceback.format_exc(limit=-3)[-4000:]
    return ""


def _forked_two_at_a_time(targets: list[tuple[str, str | None]]) -> list[str]:
    """:func:`_first_import_error` of each target, each in a child of its own, two children at a time."""
    results: dict[int, str] = {}
    running: dict[int, tuple[int, int]] = {}  # pid -> (target's index, read end of its pipe)
    queue = list(enumerate(targets))
    while queue or running:
        while queue and len(running) < 2:
            index, target = queue.pop(0)
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(read)
                os.write(write, _first_import_error(target).encode()[-4000:])  # under a pipe's buffer: never blocks
                os._exit(0)
            os.close(write)
            running[pid] = (index, read)
        pid, _ = os.wait()
        index, read = running.pop(pid)
        with os.fdopen(read, "rb") as pipe:
            results[index] = pipe.read().decode()
    return [results[index] for index in range(len(targets))]


def first_import_failures() -> list[str]:
    """Run in a fresh interpreter: load the third-party libraries, then try each of ours in a child forked for it
    alone (two at a time, one per core)."""
    for library in THIRD_PARTY:
        __import__(library)
    assert not [name for name in sys.modules if name.split(".")[0] in PACKAGES], "our packages loaded too early"
    names = exported_names()
    targets = [(module, None) for module in modules()] + [(package, name) for package, name in names]
    errors = _forked_two_at_a_time(targets)
    failures = [f"{module}{'.' + name if name else ''}: {error}" for (module, name), error in zip(targets, errors) if error]
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
