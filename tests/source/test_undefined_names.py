"""Every name the shipped code uses is defined: a missing import fails here, not at the end of a training step.

A name used only on a rarely taken path (a stop signal's safe point, one stage kind) raises NameError only when
that path runs; CI once failed a whole pipeline suite on one such missing import. pyflakes finds it statically.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pyflakes import api, messages
from pyflakes.reporter import Reporter

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("rlhfctl", "workers", "benchmarks")
UNDEFINED = (messages.UndefinedName, messages.UndefinedLocal, messages.UndefinedExport)


class _Collect(Reporter):
    """Keeps pyflakes' findings instead of printing them."""

    def __init__(self) -> None:
        super().__init__(None, None)
        self.found: list[str] = []
        self.broken: list[str] = []

    def flake(self, message) -> None:
        if isinstance(message, UNDEFINED):
            self.found.append(f"{Path(message.filename).relative_to(ROOT)}:{message.lineno}: {message.message % message.message_args}")

    def syntaxError(self, filename, msg, lineno, offset, text) -> None:
        self.broken.append(f"{filename}:{lineno}: {msg}")

    def unexpectedError(self, filename, msg) -> None:
        self.broken.append(f"{filename}: {msg}")


def _check(source: str, name: str) -> _Collect:
    collect = _Collect()
    api.check(source, str(ROOT / name), collect)
    return collect


@pytest.mark.parametrize("package", SHIPPED)
def test_the_shipped_code_uses_no_undefined_name(package: str) -> None:
    collect = _Collect()
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"no Python files under {package}/"
    for path in files:
        api.checkPath(str(path), collect)
    assert collect.broken == []
    assert collect.found == []


def test_the_check_catches_a_name_used_without_its_import() -> None:
    source = "def fit():\n    with safe_point_pending():\n        pass\n"
    assert _check(source, "rlhfctl/example.py").found == ["rlhfctl/example.py:2: undefined name 'safe_point_pending'"]
    imported = "from rlhfctl.run_signals import safe_point_pending\n" + source
    assert _check(imported, "rlhfctl/example.py").found == []
