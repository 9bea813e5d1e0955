"""A guess-the-digit environment written on OpenEnv's public classes, its typed client, and a real OpenEnv server
for it on 127.0.0.1 (uvicorn in a thread, an ephemeral port): what the OpenEnv tests talk to.

Every episode the server runs is recorded in :data:`EPISODES` (its secret, and each action's text and reward), so a
test can compare what a rollout saw with what the server gave.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any, Optional

import uvicorn
from openenv.core import EnvClient
from openenv.core.client_types import StepResult
from openenv.core.env_server import Action, Environment, Observation, State, create_fastapi_app
from pydantic import Field

from tests.environments.guess_rules import guess_step, secret_of

EPISODES: list[dict[str, Any]] = []
"""Every episode served in this process: ``{"secret": str, "steps": [(action text, reward), ...]}``."""
_LOCK = threading.Lock()


class GuessAction(Action):
    """One guess: free text; it is right when it contains the secret digit."""

    guess: str = Field(..., description="the guess")


class GuessObservation(Observation):
    """What the player reads back."""

    feedback: str = Field(default="", description="correct, or wrong, try again")
    tries: int = Field(default=0, description="guesses so far")


class GuessEnvironment(Environment):
    """Guess the secret digit (the sample's first ground-truth digit, else 7)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self.secret, self.tries = secret_of(None), 0
        self.episode: dict[str, Any] = {"secret": self.secret, "steps": []}
        self._state = State()

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, ground_truth: Any = None,
              **kwargs: Any) -> GuessObservation:
        self.secret, self.tries = secret_of(ground_truth), 0
        self.episode = {"secret": self.secret, "steps": []}
        with _LOCK:
            EPISODES.append(self.episode)
        self._state = State(episode_id=episode_id, step_count=0)
        return GuessObservation(feedback="guess the digit", tries=0)

    def step(self, action: GuessAction, timeout_s: Optional[float] = None, **kwargs: Any) -> GuessObservation:
        feedback, reward, done = guess_step(action.guess, self.secret)
        self.tries += 1
        self._state.step_count = self.tries
        self.episode["steps"].append((action.guess, reward))
        return GuessObservation(feedback=feedback, tries=self.tries, reward=reward, done=done)

    @property
    def state(self) -> State:
        return self._state


class GuessClient(EnvClient[GuessAction, GuessObservation, State]):
    """The environment's typed client (what ``openenv:tests.environments.guess_env:GuessClient`` names)."""

    def _step_payload(self, action: GuessAction) -> dict[str, Any]:
        return {"guess": action.guess}

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[GuessObservation]:
        fields = payload.get("observation", {})
        observation = GuessObservation(feedback=fields.get("feedback", ""), tries=fields.get("tries", 0),
                                       reward=payload.get("reward"), done=payload.get("done", False))
        return StepResult(observation=observation, reward=payload.get("reward"), done=payload.get("done", False))

    def _parse_state(self, payload: dict[str, Any]) -> State:
        return State(episode_id=payload.get("episode_id"), step_count=payload.get("step_count", 0))


@contextlib.contextmanager
def guess_server(max_sessions: int = 32, start_timeout_s: float = 30.0) -> Iterator[str]:
    """A running OpenEnv server of :class:`GuessEnvironment` on 127.0.0.1 (an ephemeral port); yields its URL."""
    app = create_fastapi_app(GuessEnvironment, GuessAction, GuessObservation, max_concurrent_envs=max_sessions)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, name="openenv-guess-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"the OpenEnv test server did not start within {start_timeout_s:g} s")
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
