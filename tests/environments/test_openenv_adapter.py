"""The OpenEnv adapter against a real OpenEnv server on 127.0.0.1: reset/step map the model's text to the env's
action and its observation back to text, with the env's rewards; and in an actor's agent rollout named by
``rollout.environment``, the observations are context with loss mask 0 and the rewards sum into tool_rewards."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rlhfctl.environments.openenv_adapter import OpenEnvEnvironment, OpenEnvSessionError
from tests.environments.guess_rules import CORRECT, WRONG, guess_step, secret_of

GUESS_CLIENT = "tests.environments.guess_env:GuessClient"


def episode(config: dict[str, Any], columns: dict[str, Any], guesses: list[str]) -> list[Any]:
    """reset with ``columns``, then one step per guess, then close: what the adapter returned, in order."""

    async def run() -> list[Any]:
        environment = OpenEnvEnvironment(**config)
        try:
            return [await environment.reset(**columns)] + [await environment.step(guess) for guess in guesses]
        finally:
            await environment.close()

    return asyncio.run(run())


def served(secret: str, guesses: list[str]) -> dict[str, Any]:
    """The server's record of the latest episode with this secret and these guesses."""
    from tests.environments.guess_env import EPISODES

    matches = [e for e in EPISODES if e["secret"] == secret and [text for text, _ in e["steps"]] == guesses]
    assert matches, EPISODES[-3:]
    return matches[-1]


def test_a_url_episode_sends_the_text_as_the_actions_one_string_field_and_reads_the_feedback(guess_url):
    results = episode({"base_url": guess_url}, {"ground_truth": "123"}, ["I say 5", "it is 7"])
    assert results == ["", (WRONG, 0.25, False), (CORRECT, 1.0, True)]  # no reset_columns: the default secret, 7
    assert served("7", ["I say 5", "it is 7"])["steps"] == [("I say 5", 0.25), ("it is 7", 1.0)]


def test_reset_columns_reach_the_servers_reset_and_reset_observation_continues_the_prompt(guess_url):
    config = {"base_url": guess_url, "reset_columns": ["ground_truth"], "reset_observation": True}
    results = episode(config, {"ground_truth": "39", "prompt_text": "digits 3 9:"}, ["7", "3!"])
    assert results == ["guess the digit", (WRONG, 0.25, False), (CORRECT, 1.0, True)]
    assert served("3", ["7", "3!"])["steps"] == [("7", 0.25), ("3!", 1.0)]


def test_a_typed_client_class_builds_its_own_action(guess_url):
    config = {"client": GUESS_CLIENT, "base_url": guess_url, "action_field": "guess", "observation_field": "tries"}
    # the observation's field "tries" is shown, and the typed GuessAction carries the text
    assert episode(config, {}, ["1", "2", "77"]) == ["", ("1", 0.25, False), ("2", 0.25, False), ("3", 1.0, True)]
    assert served("7", ["1", "2", "77"])["steps"] == [("1", 0.25), ("2", 0.25), ("77", 1.0)]


def test_an_action_field_the_server_lacks_and_a_missing_reset_column_are_named(guess_url):
    with pytest.raises(ValueError, match=r"the action of .* has no field 'message' \(its fields: guess\)"):
        episode({"base_url": f"{guess_url}", "action_field": "message"}, {}, ["x"])
    with pytest.raises(ValueError, match="reset_columns: the sample has no column 'answer'"):
        episode({"base_url": guess_url, "reset_columns": ["answer"]}, {"ground_truth": "1"}, [])


def test_a_full_server_is_a_session_error_that_says_to_raise_max_concurrent_envs():
    from tests.environments.guess_env import guess_server

    async def two_at_once(url: str) -> None:
        first, second = OpenEnvEnvironment(base_url=url), OpenEnvEnvironment(base_url=url)
        try:
            await first.reset()
            await second.reset()
        finally:
            await asyncio.gather(first.close(), second.close())

    with guess_server(max_sessions=1) as url:
        with pytest.raises(OpenEnvSessionError, match=f"the OpenEnv server at {url} failed a session's reset.*raise its max_concurrent_envs"):
            asyncio.run(two_at_once(url))


def test_an_actor_rollout_named_by_rollout_environment_masks_the_observations(guess_url):
    from tests.workers.conftest import local_group
    from tests.workers.recipes import digits_prompts, tiny_recipe, tokenizer
    from workers import ActorWorker

    width = 48
    recipe = tiny_recipe(rollout={
        "max_new_tokens": 6, "environment": f"openenv:{guess_url}?action_field=guess",
        "environment_config": {"reset_columns": ["ground_truth"]},
        "multi_turn": {"max_turns": 3, "max_response_tokens": width, "max_tool_response_tokens": 16},
    })
    with local_group(ActorWorker, recipe, "actor") as actor:
        rollout = actor.generate_sequences(digits_prompts(4))
    tok, columns = tokenizer(), rollout.non_tensor_batch
    mask, responses = rollout.batch["response_mask"], rollout.batch["responses"]
    real = rollout.batch["attention_mask"][:, -width:]
    assert responses.shape == (8, width) and bool((real - mask).sum() > 0)  # observations: attended, mask 0
    for row in range(len(rollout)):
        secret = secret_of(columns["ground_truth"][row])
        messages = columns["messages"][row]
        actions = [m["content"] for m in messages if m["role"] == "assistant"]
        steps = [guess_step(text, secret) for text in actions]
        assert columns["tool_rewards"][row] == pytest.approx(sum(reward for _, reward, _ in steps))
        assert columns["agent/tool_calls"][row] == len(actions) == columns["num_turns"][row]
        assert served(secret, actions)["steps"] == [(text, reward) for text, (_, reward, _) in zip(actions, steps)]
        shown = [m["content"] for m in messages[1:] if m["role"] == "user"]
        assert shown == [feedback for feedback, _, done in steps[:len(shown)]] and all(s == WRONG for s in shown)
        length = int(real[row].sum())
        holes = responses[row, :length][mask[row, :length] == 0].tolist()
        assert tok.decode(holes).count(f"user: {WRONG}\nassistant: ") == len(shown)  # only the observation turns
        policy = responses[row, :length][mask[row, :length] == 1].tolist()
        assert tok.decode(policy, skip_special_tokens=True) == "".join(actions)  # every mask-1 token is the model's
