"""RewardWorker with roles.reward.remote: the service's scores and named scores become the batch's columns, the retries
a column and meta_info, and a dead service fails the call as a lost worker (exit 3) on both backends, on_error or not."""

from __future__ import annotations

import numpy as np
import pytest

from rlhfctl.cli.errors import exit_code_for, user_message
from rlhfctl.single_controller import WorkerMethodLost
from tests.rewards.reward_services import Reply, length_scores, refused_url, reward_service
from tests.workers.conftest import local_group, ray_role_group
from tests.workers.recipes import tiny_recipe
from tests.workers.test_reward import RESPONSES, scored_batch
from workers import RewardWorker


def remote_recipe(url: str, **remote) -> dict:
    settings = {"url": url, "batch_size": 3, "timeout_s": 2.0, "max_retries": 2, "backoff_s": 0.01, "concurrency": 2,
                "columns": [], "headers_from_env": {}, **remote}
    # function stays set (the schema's default is a function): remote wins over it
    return tiny_recipe(roles={"reward": {"function": "rlhfctl.tasks.digits:score", "remote": settings}})


def test_the_service_scores_the_batch_and_its_extra_become_named_score_columns():
    script = lambda n, request: length_scores(request) if n else Reply(503, {})  # noqa: E731 - the first request fails once
    with reward_service(script) as service:
        with local_group(RewardWorker, remote_recipe(service.url, columns=["ground_truth"]), "reward") as group:
            out = group.compute_rewards(scored_batch())
    lengths = [float(len(text)) for text in RESPONSES]
    assert out.non_tensor_batch["score"].tolist() == lengths
    assert out.non_tensor_batch["reward/double"].tolist() == [2 * value for value in lengths]
    assert out.batch["token_level_scores"].sum(-1).tolist() == lengths
    assert out.non_tensor_batch["reward_retries"].sum() == 1
    assert out.meta_info["reward/remote_retries"] == 1 and out.meta_info["reward/errors"] == 0
    sent = sorted(service.requests[1:], key=lambda request: request["prompts"][0])
    assert [request["ground_truth"] for request in sent] == [["12", "3", "7"], ["9"]]
    assert sent[0]["responses"] == RESPONSES[:3]


def test_on_error_zero_does_not_turn_a_dead_service_into_zeros_it_stops_with_exit_3():
    url = refused_url()
    recipe = remote_recipe(url, max_retries=1, timeout_s=0.5)
    recipe["roles"]["reward"]["on_error"] = "zero"
    with local_group(RewardWorker, recipe, "reward") as group:
        with pytest.raises(WorkerMethodLost) as caught:
            group.compute_rewards(scored_batch())
    assert exit_code_for(caught.value) == 3
    message = user_message(caught.value)
    assert message.startswith("reward.compute_rewards failed on rank 0 (RewardWorker): RemoteRewardUnavailable: ")
    assert url in message and "ConnectionRefusedError" in message and "Traceback" not in message


def test_a_dead_service_is_a_lost_worker_through_ray_too(ray_session):
    url = refused_url()
    with ray_role_group(RewardWorker, remote_recipe(url, max_retries=0, timeout_s=0.5), "reward", "remote_reward", world=1) as group:
        with pytest.raises(WorkerMethodLost) as caught:
            group.compute_rewards(scored_batch())
    assert exit_code_for(caught.value) == 3
    assert url in str(caught.value) and "\n" not in str(caught.value)
    assert caught.value.cause == f"remote reward service {url} down"


def test_a_malformed_answer_is_a_user_error_naming_the_url():
    with reward_service(lambda n, request: Reply(200, {"scores": [1.0]})) as service:
        with local_group(RewardWorker, remote_recipe(service.url), "reward") as group:
            with pytest.raises(Exception) as caught:
                group.compute_rewards(scored_batch())
    assert exit_code_for(caught.value) == 2
    assert service.url in user_message(caught.value) and "answered 1 values in 'scores' for 3 responses" in user_message(caught.value)


def test_remote_scores_go_through_the_overlong_penalty_like_any_reward():
    with reward_service(lambda n, request: Reply(200, {"scores": [1.0] * len(request["responses"])})) as service:
        recipe = remote_recipe(service.url)
        recipe["roles"]["reward"]["overlong_buffer"] = {"enable": True, "len": 4, "penalty_factor": 1.0}
        with local_group(RewardWorker, recipe, "reward") as group:
            out = group.compute_rewards(scored_batch())
    penalty = out.non_tensor_batch["reward/overlong_penalty"]
    assert np.allclose(out.batch["token_level_scores"].sum(-1).numpy(), 1.0 + penalty.astype(float))
