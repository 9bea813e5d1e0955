"""Validation of ``roles.reward.remote``, the reward service over HTTP: an http(s) URL, columns that are not the
request's own keys, no reward model beside it, and every header's environment variable set (exit 2 from ``validate``
and ``train``, naming the key, before any worker starts).

The numbers (batch_size, timeout_s, max_retries, backoff_s, concurrency) are bounded by the schema's own field
checks. The variables are looked up on *this* host, the driver's; a reward worker on another host that lacks one
stops at its first call with the same key. Their values are never shown.
"""

from __future__ import annotations

import os
import re
from urllib.parse import urlsplit

from rlhfctl.recipe.errors import Issue, error
from rlhfctl.recipe.specs import Recipe

__all__ = ["REMOTE_KEY", "check_remote_reward"]

REMOTE_KEY = "roles.reward.remote"

_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an HTTP token (RFC 9110)


def check_remote_reward(recipe: Recipe) -> list[Issue]:
    """Errors naming ``roles.reward.remote.<key>`` (or ``roles.reward.model`` beside it); nothing without a remote
    section. A judge beside it is check_judge's to report."""
    spec = recipe.roles.get("reward")
    remote = None if spec is None else spec.settings.get("remote")
    if remote is None:
        return []
    issues = _url_issues(remote.url)
    if spec.settings.model is not None:
        issues.append(error("roles.reward.model", (
            f"roles.reward.model: a reward model and {REMOTE_KEY} are both set; the service would score and the model "
            "be loaded for nothing: remove one")))
    for name in remote.columns:
        if name in ("prompts", "responses"):
            issues.append(error(f"{REMOTE_KEY}.columns", (
                f"{REMOTE_KEY}.columns: {name!r} is the request's own key (the decoded texts are always sent); "
                "name data columns only")))
    for header, variable in remote.headers_from_env.items():
        key = f"{REMOTE_KEY}.headers_from_env.{header}"
        if not _HEADER_NAME.match(str(header)):
            issues.append(error(key, f"{key}: {header!r} is not an HTTP header name (letters, digits and -)"))
        elif not str(variable or "").strip():
            issues.append(error(key, f"{key}: name the environment variable that holds the header's value"))
        elif not os.environ.get(str(variable)):
            issues.append(error(key, (
                f"{key}: the environment variable {variable!r} is not set (or empty) on this host; export it before "
                "the run (on a Ray cluster, on every node). The header's value is read from it, never from the recipe")))
    return issues


def _url_issues(url: object) -> list[Issue]:
    key = f"{REMOTE_KEY}.url"
    if not url:
        return [error(key, f"{key}: missing required value: the service's http(s) URL, e.g. http://127.0.0.1:8123/score")]
    parts = urlsplit(str(url))
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return [error(key, f"{key}: {url!r} is not an http(s) URL with a host, e.g. http://127.0.0.1:8123/score")]
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number in 0..65535
    except ValueError as problem:
        return [error(key, f"{key}: {url!r} has a bad port ({problem})")]
    if parts.username or parts.password:
        return [error(key, (
            f"{key}: put no credentials in the URL (they would be written with the recipe); send them as a header "
            f"with {REMOTE_KEY}.headers_from_env"))]
    return []
