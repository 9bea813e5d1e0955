"""Fixtures for recipe tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.recipe.builders import BASE_RECIPE, QWEN25_7B, write_recipe


@pytest.fixture
def recipe_file(tmp_path: Path) -> Path:
    """The base stub recipe written to a temp file."""
    return write_recipe(tmp_path, BASE_RECIPE)


@pytest.fixture(scope="module")
def qwen_7b(tmp_path_factory):
    """A local model directory holding Qwen2.5-7B's config.json, and a one-line data file."""
    root = tmp_path_factory.mktemp("qwen7b")
    (root / "model").mkdir()
    (root / "model" / "config.json").write_text(json.dumps(QWEN25_7B))
    (root / "train.jsonl").write_text('{"prompt": "1 + 1 =", "ground_truth": "2"}\n')
    return root
