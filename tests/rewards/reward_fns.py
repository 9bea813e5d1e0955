"""User-style reward functions that test_combined loads by "module:function"."""

from __future__ import annotations


def length(prompts, responses):
    """len(response), with no **columns: combined must pass only prompts and responses."""
    return [float(len(response)) for response in responses]


def tagged(prompts, responses, ground_truth, bonus=0.0, **columns):
    """A dict per sample: 'score' (1 if the response is the ground truth) plus a named 'bonus'."""
    return [{"score": float(response == truth), "bonus": bonus} for response, truth in zip(responses, ground_truth)]


def wrong_length(prompts, responses, **columns):
    """One score too few."""
    return [0.0] * (len(responses) - 1)


def columns(prompts, responses, **columns):
    """The column form: a dict of per-sample lists, 'score' 1 for the response "x"."""
    return {"score": [float(response == "x") for response in responses], "len": [float(len(response)) for response in responses]}
