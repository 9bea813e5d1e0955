"""Every schema key has a help line and is documented in docs/recipes.md."""

from __future__ import annotations

import re
from pathlib import Path

from rlhfctl.recipe.typespec import field_info, iter_fields

DOCS = Path(__file__).resolve().parents[2] / "docs" / "recipes.md"


def test_every_field_has_help():
    assert [f.path for f in iter_fields() if not f.help] == []


def _documented_as(path: str) -> str:
    """Model, optim and fsdp keys (a judge's model too) are documented once, as roles.<role>.model.* / .optim.* / .fsdp.*."""
    return re.sub(r"^roles\.\w+(?:\.judge)?\.(model|optim|fsdp)\.", r"roles.<role>.\1.", path)


def test_every_key_is_documented():
    text = DOCS.read_text()
    missing = [f.path for f in iter_fields() if f"`{f.path}`" not in text and f"`{_documented_as(f.path)}`" not in text]
    assert missing == []


def test_field_info_lookup():
    info = field_info("trainer.total_steps")
    assert info.default == 40 and info.spec.kind == "int" and "steps" in info.help
    assert field_info("resource_pools.gpu.use_gpu").default is False
