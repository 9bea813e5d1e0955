"""A reward service over HTTP (``roles.reward.remote``): the responses are POSTed to it in batches and it scores them.

The exchange, one request per batch of ``batch_size`` responses (``docs/rewards.md``)::

    POST <url>    Content-Type: application/json
    {"prompts": ["...", ...], "responses": ["...", ...], "<column>": [...], ...}   (the columns of ``columns``)

    200 OK
    {"scores": [0.5, ...], "extra": {"<name>": [1.0, ...], ...}}   ("extra" optional: named scores, reward/<name>)

Up to ``concurrency`` requests are in flight at once (threads). A request that times out (``timeout_s`` bounds it
from connecting to the last byte of the answer), finds the connection refused, or is answered HTTP 5xx, 408 or 429
is retried after a wait that starts at ``backoff_s`` and doubles, up to :data:`MAX_BACKOFF_S`. A service still down
after ``max_retries`` retries raises :class:`RemoteRewardUnavailable`, a ``WorkerLost`` (exit 3), naming the URL and
the last error: a dead service is never scored as zeros, whatever ``roles.reward.on_error`` says. An answer that
breaks the contract (not JSON, no ``scores``, the wrong length, a non-number) and a request the service refuses
(another HTTP 4xx) raise :class:`RemoteRewardAnswerError` (exit 2) at once, naming the URL.

Header values come from environment variables read at each call, in the process that scores (``headers_from_env``);
they are never in the recipe, and no message or log line shows them.
"""

from __future__ import annotations

import http.client
import json
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, NamedTuple
from urllib.parse import urlsplit

import numpy as np

from rlhfctl.errors import WorkerLost
from rlhfctl.rewards.functions import RewardFunctionError, RewardOutputError
from rlhfctl.tasks.reward_fn import named_score_problem

__all__ = [
    "MAX_BACKOFF_S",
    "REMOTE_RETRIES_COLUMN",
    "REMOTE_RETRIES_METRIC",
    "RemoteRewardAnswerError",
    "RemoteRewardClient",
    "RemoteRewardSettingError",
    "RemoteRewardUnavailable",
    "RemoteScores",
    "remote_meta_info",
]

_KEY = "roles.reward.remote"
REMOTE_RETRIES_COLUMN = "reward_retries"
"""The batch column of the retries (an int per sample); the step's metric :data:`REMOTE_RETRIES_METRIC` sums it."""
REMOTE_RETRIES_METRIC = "reward/remote_retries"
MAX_BACKOFF_S = 10.0
"""The longest wait between two tries of one request."""
_RETRIED_STATUS = frozenset({408, 429})  # and every 5xx
_SHOWN_BODY = 200  # characters of an error answer quoted in a message

logger = logging.getLogger(__name__)


class RemoteRewardUnavailable(WorkerLost):
    """The reward service did not answer a request within its tries (exit 3): the step stops."""

    def __init__(self, url: str, attempts: int, last_error: str) -> None:
        self.url, self.attempts, self.last_error = url, attempts, last_error
        self.cause = f"remote reward service {url} down"
        super().__init__(
            f"remote reward service {url} did not answer after {attempts} tries ({_KEY}.max_retries={attempts - 1}); "
            f"last error: {last_error}. Start the service or fix {_KEY}.url, or raise {_KEY}.max_retries / timeout_s"
        )

    def __reduce__(self) -> tuple[Any, ...]:  # crosses the process boundary from a Ray worker intact
        return (type(self), (self.url, self.attempts, self.last_error))


class RemoteRewardAnswerError(RewardOutputError):
    """The reward service answered, but not with one finite number per response, or refused the request (HTTP 4xx)."""


class RemoteRewardSettingError(RewardFunctionError):
    """``roles.reward.remote`` cannot be used here: a header's environment variable is unset, a column is missing."""


class RemoteScores(NamedTuple):
    """What :meth:`RemoteRewardClient.score` gives back, one entry per response."""

    scores: list[float]
    named: dict[str, list[float]]
    """The answers' ``extra`` named scores, name -> one float per response (empty without ``extra``)."""
    retries: list[int]
    """The retries of the request that carried each response, counted on the request's first response (0 on the
    others), so that the column sums to the retries made."""

    def columns(self) -> dict[str, np.ndarray]:
        """The batch columns the reward worker adds beside the scores: the retries (:data:`REMOTE_RETRIES_COLUMN`)."""
        return {REMOTE_RETRIES_COLUMN: np.asarray(self.retries, dtype=np.int64)}


def remote_meta_info(columns: Mapping[str, Any]) -> dict[str, int]:
    """``{"reward/remote_retries": n}``, the retries on this rank, when ``columns`` holds the retries column."""
    if REMOTE_RETRIES_COLUMN not in columns:
        return {}
    return {REMOTE_RETRIES_METRIC: int(np.sum(columns[REMOTE_RETRIES_COLUMN]))}


class _Stopped(Exception):
    """Another request of the same call failed for good: this one gives up its remaining tries."""


@dataclass(frozen=True)
class RemoteRewardClient:
    """Scores prompts and responses with the service at ``url``: batching, concurrency, retries, answer checks."""

    url: str
    batch_size: int = 64
    timeout_s: float = 30.0
    max_retries: int = 3
    backoff_s: float = 0.5
    concurrency: int = 4
    columns: tuple[str, ...] = ()
    headers_from_env: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> RemoteRewardClient:
        """The client of a ``roles.reward.remote`` section."""
        return cls(
            url=str(config["url"]), batch_size=int(config["batch_size"]), timeout_s=float(config["timeout_s"]),
            max_retries=int(config["max_retries"]), backoff_s=float(config["backoff_s"]),
            concurrency=int(config["concurrency"]), columns=tuple(str(name) for name in config["columns"] or ()),
            headers_from_env=dict(config["headers_from_env"] or {}),
        )

    def backoff(self, retry: int) -> float:
        """Seconds to wait before retry number ``retry`` (1, 2, ...): ``backoff_s`` doubling, at most MAX_BACKOFF_S."""
        return min(MAX_BACKOFF_S, self.backoff_s * 2 ** (retry - 1))

    def score(self, prompts: Sequence[str], responses: Sequence[str], data_columns: Mapping[str, Any]) -> RemoteScores:
        """One score per response (and the answers' named scores), asking the service in batches."""
        total = len(responses)
        if total == 0:
            return RemoteScores([], {}, [])
        columns = self._columns(data_columns, total)
        headers = self.headers()
        batches = [(start, min(total, start + self.batch_size)) for start in range(0, total, self.batch_size)]
        bodies = [self._body(prompts, responses, columns, start, stop) for start, stop in batches]
        answers = self._post_all(bodies, headers)
        scores: list[float] = []
        retries: list[int] = []
        named: dict[str, list[float]] = {}
        for (start, stop), (payload, tries) in zip(batches, answers):
            batch_scores, batch_named = self.parse_answer(payload, start, stop)
            if start and sorted(batch_named) != sorted(named):
                raise RemoteRewardAnswerError(
                    f"remote reward service {self.url} answered samples {start}..{stop - 1} with extra "
                    f"{sorted(batch_named) or 'none'} but samples 0..{batches[0][1] - 1} with {sorted(named) or 'none'}; "
                    "every answer must carry the same extra names"
                )
            scores.extend(batch_scores)
            for name, values in batch_named.items():
                named.setdefault(name, []).extend(values)
            retries.extend([tries] + [0] * (stop - start - 1))
        return RemoteScores(scores, named, retries)

    # ------------------------------------------------------------------------------------------ the request
    def headers(self) -> dict[str, str]:
        """The request's headers, those of ``headers_from_env`` read from the environment now."""
        headers = {"Content-Type": "application/json", "Accept": "application/json", "User-Agent": "rlhfctl"}
        for name, variable in self.headers_from_env.items():
            value = os.environ.get(str(variable))
            if not value:
                raise RemoteRewardSettingError(
                    f"{_KEY}.headers_from_env.{name}: the environment variable {variable!r} is not set (or empty) "
                    f"where the reward worker runs (host {socket.gethostname()}); set it before starting the run "
                    "(on a Ray cluster, on every node)"
                )
            headers[str(name)] = value
        return headers

    def _columns(self, data_columns: Mapping[str, Any], total: int) -> dict[str, list[Any]]:
        picked = {}
        for name in self.columns:
            if name in ("prompts", "responses"):
                raise RemoteRewardSettingError(f"{_KEY}.columns: {name!r} is the request's own key; name a data column")
            if name not in data_columns:
                available = ", ".join(sorted(map(str, data_columns))) or "none"
                raise RemoteRewardSettingError(
                    f"{_KEY}.columns: the data has no column {name!r} (its columns: {available}); remove it from "
                    f"{_KEY}.columns or add it to the data"
                )
            values = data_columns[name]
            values = values.tolist() if hasattr(values, "tolist") else list(values)
            if len(values) != total:
                raise RemoteRewardSettingError(f"{_KEY}.columns: column {name!r} has {len(values)} values for {total} responses")
            try:
                picked[name] = json.loads(json.dumps(values, default=_json_value))  # as the service will read it
            except (TypeError, ValueError) as error:
                raise RemoteRewardSettingError(
                    f"{_KEY}.columns: column {name!r} cannot be sent as JSON ({error}); send columns of strings, "
                    "numbers, lists or mappings"
                ) from None
        return picked

    def _body(self, prompts: Sequence[str], responses: Sequence[str], columns: Mapping[str, list[Any]],
              start: int, stop: int) -> bytes:
        request = {"prompts": [str(p) for p in prompts[start:stop]], "responses": [str(r) for r in responses[start:stop]]}
        request.update({name: values[start:stop] for name, values in columns.items()})
        return json.dumps(request).encode("utf-8")

    def _post_all(self, bodies: list[bytes], headers: Mapping[str, str]) -> list[tuple[bytes, int]]:
        """Every body's answer and retries, in order; up to ``concurrency`` in flight. The first request that fails
        for good stops the others (at their next try) and is raised."""
        stop = threading.Event()
        pool = ThreadPoolExecutor(max_workers=min(self.concurrency, len(bodies)), thread_name_prefix="remote-reward")
        try:
            futures = [pool.submit(self._post_with_retries, body, headers, stop) for body in bodies]
            rounds = math.ceil(len(bodies) / self.concurrency)
            done, pending = wait(futures, timeout=rounds * self._request_bound() + 30.0, return_when=FIRST_EXCEPTION)
            failed = [future for future in futures if future in done and _real_failure(future)]
            if failed:
                raise failed[0].exception()  # type: ignore[misc]
            if pending:
                raise RemoteRewardUnavailable(self.url, self.max_retries + 1, "no answer within the requests' bounds")
            return [future.result() for future in futures]
        finally:
            stop.set()  # requests still retrying give up at their next wait; none is waited for here
            pool.shutdown(wait=False, cancel_futures=True)

    def _request_bound(self) -> float:
        """The longest one request may take, every try and wait included."""
        return (self.max_retries + 1) * self.timeout_s + sum(self.backoff(n) for n in range(1, self.max_retries + 1))

    def _post_with_retries(self, body: bytes, headers: Mapping[str, str], stop: threading.Event) -> tuple[bytes, int]:
        last_error = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                wait_s = self.backoff(attempt)
                logger.warning("remote reward service %s: try %d of %d failed (%s); retrying in %.2g s",
                               self.url, attempt, self.max_retries + 1, last_error, wait_s)
                if stop.wait(wait_s):
                    raise _Stopped
            elif stop.is_set():
                raise _Stopped
            try:
                status, payload = self._post_once(body, headers)
            except (OSError, http.client.HTTPException) as error:  # refused, reset, timed out, a broken answer
                last_error = _describe(error, self.timeout_s)
                continue
            if 200 <= status < 300:
                return payload, attempt
            last_error = f"HTTP {status}: {_shown(payload)}"
            if status < 500 and status not in _RETRIED_STATUS:
                raise RemoteRewardAnswerError(
                    f"remote reward service {self.url} refused the request with {last_error} (not retried: check "
                    f"{_KEY}.url and {_KEY}.headers_from_env)"
                )
        raise RemoteRewardUnavailable(self.url, self.max_retries + 1, last_error)

    def _post_once(self, body: bytes, headers: Mapping[str, str]) -> tuple[int, bytes]:
        """One POST, its status and whole answer, within ``timeout_s`` from connecting to the last byte: a watchdog
        shuts the socket at the deadline, so a service that trickles its answer cannot stretch the call."""
        deadline = time.monotonic() + self.timeout_s
        parts = urlsplit(self.url)
        kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        connection = kind(parts.hostname or "", parts.port, timeout=self.timeout_s)
        cut = threading.Event()
        watchdog: threading.Timer | None = None
        try:
            connection.connect()
            watchdog = threading.Timer(_left(deadline), _cut, args=(connection.sock, cut))
            watchdog.daemon = True
            watchdog.start()
            target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            connection.request("POST", target, body=body, headers=dict(headers))
            response = connection.getresponse()
            return response.status, response.read()
        except (OSError, http.client.HTTPException):
            if cut.is_set():
                raise TimeoutError("timed out") from None
            raise
        finally:
            if watchdog is not None:
                watchdog.cancel()
            connection.close()

    # ------------------------------------------------------------------------------------------ the answer
    def parse_answer(self, payload: bytes, start: int, stop: int) -> tuple[list[float], dict[str, list[float]]]:
        """The scores and ``extra`` named scores of one answer for samples ``start..stop-1``, or
        RemoteRewardAnswerError naming the URL and what is wrong."""
        where = f"remote reward service {self.url} (samples {start}..{stop - 1})"
        try:
            answer = json.loads(payload)
        except ValueError:
            raise RemoteRewardAnswerError(f"{where} answered with something other than JSON: {_shown(payload)}") from None
        if not isinstance(answer, Mapping) or "scores" not in answer:
            raise RemoteRewardAnswerError(
                f"{where} answered {_shown(payload)}; expected a JSON object {{\"scores\": [one number per response], "
                "\"extra\": {name: [...]} (optional)}"
            )
        scores = _numbers(answer["scores"], "scores", where, stop - start)
        extra = answer.get("extra") or {}
        if not isinstance(extra, Mapping):
            raise RemoteRewardAnswerError(f"{where} answered 'extra' as a {type(extra).__name__}; expected {{name: [...]}}")
        named = {}
        for name, values in extra.items():
            problem = named_score_problem(name)
            if problem:
                raise RemoteRewardAnswerError(f"{where}, extra: {problem}")
            named[name] = _numbers(values, f"extra.{name}", where, stop - start)
        return scores, named


def _numbers(values: Any, key: str, where: str, count: int) -> list[float]:
    """``values`` as ``count`` finite floats, or RemoteRewardAnswerError saying which one is wrong."""
    if not isinstance(values, list) or len(values) != count:
        size = f"{len(values)} values" if isinstance(values, list) else f"a {type(values).__name__}"
        raise RemoteRewardAnswerError(f"{where} answered {size} in {key!r} for {count} responses; expected one number per response")
    numbers = []
    for index, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise RemoteRewardAnswerError(f"{where} answered {value!r} in {key!r} at position {index}; expected a finite number")
        numbers.append(float(value))
    return numbers


def _real_failure(future: Future) -> bool:
    error = future.exception()
    return error is not None and not isinstance(error, _Stopped)


def _json_value(value: Any) -> Any:
    """A column value JSON cannot take as it is: NumPy scalars and arrays, tuples and sets."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (tuple, set, frozenset)):
        return list(value)
    raise TypeError(f"a {type(value).__name__} is not JSON")


def _cut(sock: socket.socket, cut: threading.Event) -> None:
    """The watchdog of one request: shut its socket, so that whatever read or write it is in returns now."""
    cut.set()
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed: the request finished as the deadline came


def _left(deadline: float) -> float:
    """Seconds left before ``deadline``; a TimeoutError once it has passed."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("timed out")
    return left


def _describe(error: BaseException, timeout_s: float) -> str:
    if isinstance(error, (TimeoutError, socket.timeout)):
        return f"no answer within timeout_s={timeout_s:g} s"
    text = str(error).strip()
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _shown(payload: bytes) -> str:
    text = payload.decode("utf-8", errors="replace").strip()
    return repr(text if len(text) <= _SHOWN_BODY else text[:_SHOWN_BODY] + "...")
