"""Stand-in worker classes for recipe and CLI tests: registered methods only, no models."""

from __future__ import annotations

from rlhfctl.single_controller import Dispatch, Execute, Worker, register


class StubActor(Worker):
    """Everything an actor needs, including compute_ref_log_prob (LoRA reference)."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        return None

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def generate_sequences(self, prompts):
        return prompts

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def compute_log_prob(self, data):
        return data

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def compute_ref_log_prob(self, data):
        return data

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def update_actor(self, data):
        return {}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, execute_mode=Execute.RANK_ZERO, blocking=False)
    def export(self, directory):
        return directory


class StubActorNoRef(Worker):
    """An actor without compute_ref_log_prob, and with update_actor not registered."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        return None

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def generate_sequences(self, prompts):
        return prompts

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def compute_log_prob(self, data):
        return data

    def update_actor(self, data):
        return {}


class StubReference(Worker):
    """Reference log-probs."""

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def compute_ref_log_prob(self, data):
        return data


class StubCritic(Worker):
    """Values and critic updates."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        return None

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def compute_values(self, data):
        return data

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def update_critic(self, data):
        return {}


class StubReward(Worker):
    """Rewards, dispatched to rank 0 only to exercise RANK_ZERO in the plan."""

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def compute_rewards(self, data):
        return data


NOT_A_CLASS = 3


def reward_fn(prompts, responses, **columns):
    """A reward function for recipe tests (never called by them)."""
    return [0.0 for _ in responses]
