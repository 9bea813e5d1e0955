"""Property: any mutation of a recipe ends in a clean RecipeError or a valid config, never another exception."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlhfctl.recipe import RecipeError, validate_recipe
from rlhfctl.recipe.load import recipe_from_dict
from tests.recipe.builders import BASE_RECIPE

# Keys naming code are only given harmless values: the property is about values, not about importing
# arbitrary modules.
_CODE_KEYS = {"worker", "function", "import_modules"}
_SAFE_CODE = st.sampled_from(["nowhere.Module", "tests.recipe.stub_workers.StubActor", "rlhfctl.tasks.digits:score", "os:sep", ""])

_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(alphabet="abcxyz019_-.:/ ${}?[]", max_size=12),
    st.sampled_from(["???", "${trainer.batch_size}", "${nope}", "ray", "local", "gae", "k3", "token-mean", "all-linear"]),
)
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                         st.dictionaries(st.text("abcxyz_", min_size=1, max_size=6), inner, max_size=3)),
                       max_leaves=6)


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    found = [prefix] if prefix else []
    if isinstance(node, dict):
        for key, value in node.items():
            found += _paths(value, (*prefix, key))
    return found


def _set(data: dict, path: tuple, value: Any) -> None:
    node = data
    for key in path[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[path[-1]] = value


_MUTATIONS = st.sampled_from(["set", "delete", "unknown", "scalar_section"])


@st.composite
def mutated_recipes(draw) -> tuple[dict, list[str]]:
    data = copy.deepcopy(BASE_RECIPE)
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        paths = _paths(data) or [("trainer",)]
        path = draw(st.sampled_from(paths))
        kind = draw(_MUTATIONS)
        if kind == "set":
            _set(data, path, draw(_SAFE_CODE if path[-1] in _CODE_KEYS else _VALUES))
        elif kind == "delete":
            _set(data, path, None)
            parent = data
            for key in path[:-1]:
                parent = parent[key]
            del parent[path[-1]]
        elif kind == "unknown":
            _set(data, (*path[:-1], draw(st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=10))), draw(_SCALARS))
        else:
            _set(data, path[:1], draw(_SCALARS))
    overrides = draw(st.lists(st.one_of(
        st.builds(lambda key, value: f"{key}={value}",
                  st.sampled_from(["trainer.total_steps", "trainer.batch_size", "rollout.n", "roles.critic.cliprange_value",
                                   "resource_pools.main.process_on_nodes", "data.train_files", "roles.actor.lora",
                                   "algorithm.kl.kind", "trainer.mini_batch_size", "roles.actor.micro_batch_size", "bogus.key"]),
                  st.text(alphabet="0123456789-.[], abc:{}~$?", max_size=10)),
        st.sampled_from(["~roles.reference", "~roles.critic", "~trainer.total_steps", "~resource_pools.main", "~nope", "garbage"]),
    ), max_size=2))
    return data, overrides


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(mutated_recipes())
def test_mutations_end_in_recipe_error_or_a_valid_config(case):
    data, overrides = case
    try:
        cfg = recipe_from_dict(data, overrides)
    except RecipeError as error:
        assert str(error) and "\n" not in str(error)
        return
    report = validate_recipe(cfg)  # never raises; problems become issues
    assert all(issue.message for issue in report.issues)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(max_size=30), max_size=3))
def test_arbitrary_override_text_is_handled(overrides):
    try:
        recipe_from_dict(copy.deepcopy(BASE_RECIPE), overrides)
    except RecipeError:
        pass
