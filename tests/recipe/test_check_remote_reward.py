"""validate and roles.reward.remote: the URL, the numbers, the header variables (exit 2 naming the key), and the
service taking precedence over roles.reward.function."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlhfctl.cli import app
from rlhfctl.recipe import load_recipe
from rlhfctl.recipe.errors import RecipeError
from rlhfctl.recipe.validate import validate_recipe

QUICKSTART = Path(__file__).resolve().parents[2] / "recipes" / "quickstart.yaml"
URL = "roles.reward.remote.url=http://127.0.0.1:8123/score"


def errors(*overrides: str) -> dict[str, str]:
    report = validate_recipe(load_recipe(QUICKSTART, list(overrides)))
    return {issue.key_path: issue.message for issue in report.errors}


def test_a_remote_service_with_an_http_url_is_valid_and_the_unused_function_is_not_checked():
    # the function would not import; the service scores, so validate does not load it
    assert errors(URL, "roles.reward.function=no_such_module:score") == {}
    assert "roles.reward.function" in errors("roles.reward.function=no_such_module:score")


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("ftp://host/score", "'ftp://host/score' is not an http(s) URL with a host"),
        ("127.0.0.1:8123/score", "is not an http(s) URL with a host"),
        ("http://127.0.0.1:99999/score", "has a bad port"),
        ("http://user:pw@127.0.0.1/score", "put no credentials in the URL"),
    ],
)
def test_a_url_that_is_not_http_with_a_host_is_an_error_naming_the_key(url, problem):
    found = errors(f"roles.reward.remote.url={url}")
    assert problem in found["roles.reward.remote.url"]


def test_a_remote_section_without_a_url_is_an_error():
    found = errors("roles.reward.remote.batch_size=8")
    assert "missing required value" in found["roles.reward.remote.url"]


@pytest.mark.parametrize(
    ("override", "key", "words"),
    [
        ("roles.reward.remote.batch_size=0", "roles.reward.remote.batch_size", "must be >= 1"),
        ("roles.reward.remote.timeout_s=0", "roles.reward.remote.timeout_s", "must be > 0"),
        ("roles.reward.remote.max_retries=-1", "roles.reward.remote.max_retries", "must be >= 0"),
        ("roles.reward.remote.concurrency=0", "roles.reward.remote.concurrency", "must be >= 1"),
        ("roles.reward.remote.backoff_s=-0.5", "roles.reward.remote.backoff_s", "must be >= 0"),
    ],
)
def test_numbers_out_of_range_are_errors_naming_the_key(override, key, words):
    with pytest.raises(RecipeError) as caught:  # the schema's bounds, checked as the recipe loads
        load_recipe(QUICKSTART, [URL, override])
    assert caught.value.key_path == key and words in str(caught.value)


def test_a_header_variable_missing_from_the_environment_names_the_header_key(monkeypatch):
    monkeypatch.delenv("REMOTE_REWARD_MISSING", raising=False)
    monkeypatch.setenv("REMOTE_REWARD_PRESENT", "value-never-shown")
    found = errors(URL, "roles.reward.remote.headers_from_env={X-Api-Key: REMOTE_REWARD_MISSING, "
                        "Authorization: REMOTE_REWARD_PRESENT}")
    assert list(found) == ["roles.reward.remote.headers_from_env.X-Api-Key"]
    assert "'REMOTE_REWARD_MISSING' is not set" in found["roles.reward.remote.headers_from_env.X-Api-Key"]


def test_a_bad_header_name_and_a_reserved_column_are_errors():
    found = errors(URL, "roles.reward.remote.headers_from_env={'Bad Header': HOME}", "roles.reward.remote.columns=[prompts]")
    assert "is not an HTTP header name" in found["roles.reward.remote.headers_from_env.Bad Header"]
    assert "'prompts' is the request's own key" in found["roles.reward.remote.columns"]


def test_validate_exits_2_naming_the_key_without_a_traceback(monkeypatch):
    from typer.testing import CliRunner

    monkeypatch.delenv("REMOTE_REWARD_MISSING", raising=False)
    result = CliRunner().invoke(app, ["validate", str(QUICKSTART), URL,
                                      "roles.reward.remote.headers_from_env={X-Api-Key: REMOTE_REWARD_MISSING}"])
    assert result.exit_code == 2
    assert "roles.reward.remote.headers_from_env.X-Api-Key" in result.output and "Traceback" not in result.output
