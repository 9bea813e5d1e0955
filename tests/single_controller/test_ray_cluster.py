"""How rlhfctl starts or joins Ray: what it asks of a private local Ray, and what it leaves to a cluster."""

from __future__ import annotations

import ray

from rlhfctl import ray_cluster


def captured_init(monkeypatch):
    calls = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: calls.append(kwargs))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return calls


def test_private_ray_inlines_objects_up_to_a_mebibyte_and_keeps_the_dashboard_local(monkeypatch):
    calls = captured_init(monkeypatch)
    monkeypatch.setenv("RLHFCTL_SHARED_PROMPT_PASS", "0")
    session = ray_cluster.start_or_join_ray(num_cpus=2)
    (kwargs,) = calls
    assert session.started_here
    assert kwargs["_system_config"] == {"max_direct_call_object_size": 1024 * 1024}
    assert kwargs["include_dashboard"] is False and kwargs["dashboard_host"] == "127.0.0.1"
    assert kwargs["runtime_env"]["env_vars"]["RLHFCTL_SHARED_PROMPT_PASS"] == "0"  # switches reach workers


def test_a_joined_cluster_keeps_its_own_system_config(monkeypatch):
    calls = captured_init(monkeypatch)
    session = ray_cluster.start_or_join_ray(address="ray://head:10001")
    (kwargs,) = calls
    assert not session.started_here and kwargs["address"] == "ray://head:10001"
    assert "_system_config" not in kwargs  # Ray rejects it when connecting to a running cluster
