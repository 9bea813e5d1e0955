"""The remote reward service client against real HTTP servers on 127.0.0.1: scores and named scores, batching and
concurrency, retries on timeouts and 5xx, a service that stays down (exit 3, bounded in time), bad answers (exit 2),
headers from the environment."""

from __future__ import annotations

import time

import numpy as np
import pytest

from rlhfctl.cli.errors import exit_code_for
from rlhfctl.errors import WorkerLost
from rlhfctl.rewards.remote_service import (
    RemoteRewardAnswerError,
    RemoteRewardClient,
    RemoteRewardSettingError,
    RemoteRewardUnavailable,
    remote_meta_info,
)
from tests.rewards.reward_services import Reply, length_scores, refused_url, reward_service

PROMPTS = [f"p{i}" for i in range(5)]
RESPONSES = ["a", "bb", "ccc", "dddd", "eeeee"]
SLACK_S = 1.5  # thread start-up and a loaded 2-core CI machine


def client(url: str, **settings) -> RemoteRewardClient:
    return RemoteRewardClient(url, **{"batch_size": 2, "timeout_s": 2.0, "max_retries": 2, "backoff_s": 0.05, **settings})


def bound_s(remote: RemoteRewardClient) -> float:
    """The longest one request may take: every try at its timeout plus every wait between tries."""
    return (remote.max_retries + 1) * remote.timeout_s + sum(remote.backoff(n) for n in range(1, remote.max_retries + 1))


def test_an_answering_service_scores_every_response_in_batches_with_named_scores_and_columns():
    with reward_service(lambda n, request: length_scores(request)) as service:
        remote = client(service.url, columns=("ground_truth",))
        truth = np.asarray(["1", "2", "3", "4", "5"], dtype=object)
        result = remote.score(PROMPTS, RESPONSES, {"ground_truth": truth, "index": np.arange(5)})
    assert result.scores == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert result.named == {"double": [2.0, 4.0, 6.0, 8.0, 10.0]}
    assert result.retries == [0, 0, 0, 0, 0]
    # batches of 2 (the last one short), each with the named column only, in order whatever the threads did
    batches = sorted(service.requests, key=lambda request: request["prompts"][0])
    assert [request["responses"] for request in batches] == [["a", "bb"], ["ccc", "dddd"], ["eeeee"]]
    assert batches[1] == {"prompts": ["p2", "p3"], "responses": ["ccc", "dddd"], "ground_truth": ["3", "4"]}
    assert service.headers[0]["Content-Type"] == "application/json"


def test_up_to_concurrency_requests_are_in_flight_at_once():
    with reward_service(lambda n, request: Reply(200, {"scores": [0.5] * len(request["responses"])}, delay_s=0.4)) as service:
        remote = client(service.url, batch_size=1, concurrency=3)
        started = time.monotonic()
        result = remote.score(["p"] * 6, ["r"] * 6, {})
        elapsed = time.monotonic() - started
    assert result.scores == [0.5] * 6
    assert service.max_in_flight == 3
    assert elapsed < 6 * 0.4  # two rounds of three, not six one after the other


def test_a_slow_answer_times_out_and_is_retried_then_counted():
    # requests 0 and 1 answer after 1.5 s, past the 0.3 s timeout; the third try is answered at once
    script = lambda n, request: length_scores(request) if n >= 2 else Reply(200, {"scores": [0.0]}, delay_s=1.5)  # noqa: E731
    with reward_service(script) as service:
        remote = client(service.url, batch_size=8, timeout_s=0.3, max_retries=3)
        started = time.monotonic()
        result = remote.score(PROMPTS, RESPONSES, {})
        elapsed = time.monotonic() - started
    assert result.scores == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert result.retries == [2, 0, 0, 0, 0]  # on the request's first response: the column sums to the retries
    assert remote_meta_info(result.columns()) == {"reward/remote_retries": 2}
    assert len(service.requests) == 3
    assert elapsed <= 2 * 0.3 + remote.backoff(1) + remote.backoff(2) + SLACK_S


def test_a_trickling_answer_is_cut_at_timeout_s_however_it_keeps_sending():
    # one byte every 0.1 s: each read is quick, the whole answer would take seconds
    with reward_service(lambda n, request: Reply(200, {"scores": [1.0] * 40}, trickle_s=0.1)) as service:
        remote = client(service.url, batch_size=8, timeout_s=0.5, max_retries=0)
        started = time.monotonic()
        with pytest.raises(RemoteRewardUnavailable, match=r"no answer within timeout_s=0.5 s"):
            remote.score(PROMPTS, RESPONSES, {})
        assert time.monotonic() - started <= 0.5 + SLACK_S


def test_a_503_then_recovery_is_retried_with_growing_waits():
    script = lambda n, request: length_scores(request) if n >= 2 else Reply(503, {"error": "warming up"})  # noqa: E731
    with reward_service(script) as service:
        remote = client(service.url, batch_size=8, backoff_s=0.2, max_retries=2)
        started = time.monotonic()
        result = remote.score(PROMPTS, RESPONSES, {})
        elapsed = time.monotonic() - started
    assert result.scores == [1.0, 2.0, 3.0, 4.0, 5.0] and result.retries[0] == 2
    assert remote.backoff(1) == 0.2 and remote.backoff(2) == 0.4
    assert 0.6 <= elapsed <= 0.6 + SLACK_S  # it waited 0.2 s, then 0.4 s


def test_backoff_doubles_up_to_its_cap():
    remote = client("http://127.0.0.1:1/", backoff_s=1.0)
    assert [remote.backoff(n) for n in range(1, 7)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


def test_a_refused_connection_past_max_retries_is_exit_3_naming_the_url_and_the_error_within_its_bound():
    url = refused_url()
    remote = client(url, batch_size=8, timeout_s=0.5, max_retries=2, backoff_s=0.1)
    started = time.monotonic()
    with pytest.raises(RemoteRewardUnavailable) as caught:
        remote.score(PROMPTS, RESPONSES, {})
    assert time.monotonic() - started <= bound_s(remote) + SLACK_S
    message = str(caught.value)
    assert url in message and "after 3 tries" in message and "ConnectionRefusedError" in message
    assert "roles.reward.remote.max_retries=2" in message
    assert isinstance(caught.value, WorkerLost) and exit_code_for(caught.value) == 3


def test_a_service_that_always_answers_500_is_tried_max_retries_plus_one_times_then_exit_3():
    with reward_service(lambda n, request: Reply(500, {"error": "model crashed"})) as service:
        remote = client(service.url, batch_size=8, max_retries=3, backoff_s=0.01)
        with pytest.raises(RemoteRewardUnavailable) as caught:
            remote.score(PROMPTS, RESPONSES, {})
    assert len(service.requests) == 4
    assert service.url in str(caught.value) and "HTTP 500" in str(caught.value) and "model crashed" in str(caught.value)


def test_a_service_that_always_times_out_stops_within_max_retries_times_timeout_plus_the_waits():
    with reward_service(lambda n, request: Reply(200, {"scores": [1.0] * 5}, delay_s=3.0)) as service:
        remote = client(service.url, batch_size=8, timeout_s=0.3, max_retries=2, backoff_s=0.1)
        started = time.monotonic()
        with pytest.raises(RemoteRewardUnavailable, match="no answer within timeout_s=0.3 s"):
            remote.score(PROMPTS, RESPONSES, {})
        elapsed = time.monotonic() - started
    assert len(service.requests) == 3
    assert elapsed <= bound_s(remote) + SLACK_S


def test_one_batch_down_for_good_stops_the_others_instead_of_letting_them_retry():
    # the batch starting at "a" fails at once for good; the others answer 503 forever with long waits between tries
    def script(n, request):
        return Reply(404, {"error": "no such route"}) if request["responses"][0] == "a" else Reply(503, {})

    with reward_service(script) as service:
        remote = client(service.url, batch_size=1, concurrency=5, max_retries=5, backoff_s=2.0)
        started = time.monotonic()
        with pytest.raises(RemoteRewardAnswerError, match="HTTP 404"):
            remote.score(PROMPTS, RESPONSES, {})
        assert time.monotonic() - started < 2.0 + SLACK_S  # the others gave up at their first wait
    assert len(service.requests) <= 5


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ({"scores": [1.0, 2.0]}, "answered 2 values in 'scores' for 5 responses"),
        ({"scores": [1.0, "x", 3.0, 4.0, 5.0]}, "answered 'x' in 'scores' at position 1"),
        ({"scores": [1.0, True, 3.0, 4.0, 5.0]}, "answered True in 'scores' at position 1"),
        ({"result": [1.0] * 5}, "expected a JSON object {\"scores\""),
        (b"<html>oops</html>", "something other than JSON: '<html>oops</html>'"),
        ({"scores": [1.0] * 5, "extra": {"acc": [1.0] * 4}}, "answered 4 values in 'extra.acc' for 5 responses"),
        ({"scores": [1.0] * 5, "extra": {"a/b": [1.0] * 5}}, "has a '/'"),
        (b'{"scores": [1.0, NaN, 1.0, 1.0, 1.0]}', "answered nan in 'scores' at position 1"),
    ],
)
def test_a_malformed_answer_is_a_clear_error_naming_the_url_and_is_not_retried(body, problem):
    with reward_service(lambda n, request: Reply(200, body)) as service:
        with pytest.raises(RemoteRewardAnswerError) as caught:
            client(service.url, batch_size=8).score(PROMPTS, RESPONSES, {})
    assert service.url in str(caught.value) and problem in str(caught.value)
    assert len(service.requests) == 1
    assert exit_code_for(caught.value) == 2


def test_answers_that_disagree_on_extra_names_are_an_error():
    def script(n, request):
        extra = {"acc": [1.0] * len(request["responses"])} if request["prompts"][0] == "p0" else {}
        return Reply(200, {"scores": [1.0] * len(request["responses"]), "extra": extra})

    with reward_service(script) as service:
        with pytest.raises(RemoteRewardAnswerError, match=r"samples 2\.\.3 with extra 'none'|samples 2\.\.3 with extra none"):
            client(service.url).score(PROMPTS, RESPONSES, {})


def test_headers_come_from_the_environment_at_call_time_and_their_values_are_never_shown(monkeypatch):
    monkeypatch.setenv("REMOTE_REWARD_TEST_KEY", "s3cret-value")

    def script(n, request):
        return Reply(401, {"error": "bad key"}) if n == 0 else length_scores(request)

    with reward_service(script) as service:
        remote = client(service.url, batch_size=8, headers_from_env={"X-Api-Key": "REMOTE_REWARD_TEST_KEY"})
        with pytest.raises(RemoteRewardAnswerError) as caught:
            remote.score(PROMPTS, RESPONSES, {})
        assert "HTTP 401" in str(caught.value) and "s3cret-value" not in str(caught.value)
        assert len(service.requests) == 1  # a 401 is not retried
        monkeypatch.setenv("REMOTE_REWARD_TEST_KEY", "rotated")  # read again at the next call
        assert remote.score(PROMPTS, RESPONSES, {}).scores == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert [headers["X-Api-Key"] for headers in service.headers] == ["s3cret-value", "rotated"]
    assert "s3cret-value" not in repr(remote)


def test_a_missing_header_variable_names_the_key_and_the_variable(monkeypatch):
    monkeypatch.delenv("REMOTE_REWARD_UNSET", raising=False)
    remote = client(refused_url(), headers_from_env={"Authorization": "REMOTE_REWARD_UNSET"})
    with pytest.raises(RemoteRewardSettingError) as caught:
        remote.score(PROMPTS, RESPONSES, {})
    assert "roles.reward.remote.headers_from_env.Authorization" in str(caught.value)
    assert "'REMOTE_REWARD_UNSET' is not set" in str(caught.value)
    assert exit_code_for(caught.value) == 2


def test_a_named_column_missing_from_the_data_names_roles_reward_remote_columns():
    remote = client(refused_url(), columns=("ground_truth",))
    with pytest.raises(RemoteRewardSettingError) as caught:
        remote.score(PROMPTS, RESPONSES, {"index": np.arange(5)})
    assert str(caught.value).startswith("roles.reward.remote.columns: the data has no column 'ground_truth'")
    assert "(its columns: index)" in str(caught.value)


def test_numpy_and_nested_column_values_are_sent_as_json():
    with reward_service(lambda n, request: length_scores(request)) as service:
        values = np.empty(5, dtype=object)
        values[:] = [np.array([i, i + 1]) for i in range(5)]
        client(service.url, batch_size=8, columns=("pairs", "weights")).score(
            PROMPTS, RESPONSES, {"pairs": values, "weights": np.linspace(0, 1, 5)})
    assert service.requests[0]["pairs"][1] == [1, 2]
    assert service.requests[0]["weights"] == [0.0, 0.25, 0.5, 0.75, 1.0]


def test_no_responses_sends_no_request():
    assert client(refused_url()).score([], [], {}).scores == []
