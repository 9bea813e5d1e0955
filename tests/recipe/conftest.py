"""Fixtures for recipe tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.recipe.builders import BASE_RECIPE, write_recipe


@pytest.fixture
def recipe_file(tmp_path: Path) -> Path:
    """The base stub recipe written to a temp file."""
    return write_recipe(tmp_path, BASE_RECIPE)
