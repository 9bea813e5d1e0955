"""The restart policy (trainer.max_restarts), the wait for the pools' resources, and which checkpoint counts as complete."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from rlhfctl.errors import WorkerLost
from rlhfctl.single_controller.errors import WorkerDiedError, WorkerTimeoutError
from rlhfctl.trainer import checkpoint, restarts
from rlhfctl.trainer.restarts import RestartPolicy, RestartsExhausted, pool_needs, restart_recipe, wait_for_resources


def test_no_restarts_raises_the_lost_worker_itself():
    error = WorkerDiedError("actor", "update_actor", 0, "killed")
    with pytest.raises(WorkerDiedError) as raised:
        RestartPolicy(max_restarts=0).record(error, 4)
    assert raised.value is error


def test_failures_past_max_restarts_exit_as_a_lost_worker_listing_every_one():
    policy = RestartPolicy(max_restarts=1)
    first = policy.record(WorkerDiedError("actor", "generate_sequences", 1), 4)
    assert str(first) == "after step 4: actor rank 1 lost during actor.generate_sequences (process died)"
    assert policy.restarts == 1
    with pytest.raises(RestartsExhausted) as raised:
        policy.record(WorkerTimeoutError("critic", "update_critic", 30, [2, 3]), 6)
    assert isinstance(raised.value, WorkerLost)  # exit 3
    message = str(raised.value)
    assert message.startswith("trainer.max_restarts=1 used up; 2 worker failure(s): ")
    assert "[1] after step 4: actor rank 1 lost during actor.generate_sequences (process died)" in message
    assert "[2] after step 6: critic rank 2 lost during critic.update_critic (no answer within trainer.call_timeout_s=30 s)" in message


def test_the_wait_for_resources_ends_when_they_are_free_or_gives_up(monkeypatch):
    monkeypatch.setattr(restarts, "POLL_S", 0.01)
    answers = iter([{"CPU": 0.5}, {"CPU": 1.5, "GPU": 2.0}])
    assert wait_for_resources({"CPU": 1.0, "GPU": 2.0}, 5, lambda: next(answers))
    assert not wait_for_resources({"CPU": 1.0}, 0.05, lambda: {"CPU": 0.0})
    assert wait_for_resources({"CPU": 1.0}, 0, lambda: None)  # no Ray (the local backend): nothing to wait for
    policy = RestartPolicy(max_restarts=2, wait_s=0.0)
    policy.record(WorkerDiedError("actor", "update_actor", 0), 2)
    monkeypatch.setattr(restarts, "_ray_available", lambda: {"CPU": 0.0})
    with pytest.raises(RestartsExhausted, match=r"resources \{CPU: 1\} were not free again within trainer.restart_wait_s=0 s"):
        policy.wait_for_resources({"CPU": 1.0}, RuntimeError())


def test_pool_needs_add_up_every_pools_bundles():
    pool = lambda size, bundle: SimpleNamespace(world_size=size, bundle=lambda: bundle)  # noqa: E731
    assert pool_needs([pool(2, {"CPU": 0.5}), pool(4, {"CPU": 1.0, "GPU": 1.0})]) == {"CPU": 5.0, "GPU": 4.0}


def _save(output_dir, step):
    def roles(directory):
        (directory / "actor").mkdir()
        (directory / "actor" / "shard.bin").write_bytes(b"x" * 64)
    return checkpoint.save_checkpoint(output_dir, step, {"step": step}, roles)


def test_a_checkpoint_missing_a_file_is_passed_over_for_the_newest_whole_one(tmp_path):
    _save(tmp_path, 2)
    newest = _save(tmp_path, 4)
    assert checkpoint.read_latest(tmp_path) == newest
    (newest / "actor" / "shard.bin").write_bytes(b"x" * 10)  # cut short
    assert checkpoint.missing_parts(newest) == ["actor/shard.bin"]
    assert checkpoint.read_latest(tmp_path) == tmp_path / "checkpoints" / "step_2"
    (newest / checkpoint.MANIFEST_FILE).unlink()  # a deletion that took the manifest first
    assert checkpoint.read_latest(tmp_path) == tmp_path / "checkpoints" / "step_2"
    with pytest.raises(Exception, match="is not a complete checkpoint"):
        checkpoint.resume_point(str(newest), tmp_path)


def test_saving_a_step_again_replaces_it_whole(tmp_path):
    _save(tmp_path, 2)
    again = _save(tmp_path, 2)
    assert checkpoint.is_complete(again) and not list((tmp_path / "checkpoints").glob("*.old"))


def test_a_checkpoint_from_before_manifests_still_resumes(tmp_path):
    legacy = tmp_path / "checkpoints" / "step_3"
    legacy.mkdir(parents=True)
    (legacy / checkpoint.STATE_FILE).write_text('{"step": 3}')
    assert checkpoint.read_latest(tmp_path) == legacy


def test_a_restart_resumes_from_this_runs_latest_checkpoint_else_as_the_run_began(tmp_path):
    cfg = OmegaConf.create({"trainer": {"resume": "never", "output_dir": str(tmp_path)}})
    restarted, where = restart_recipe(cfg, tmp_path, 0)
    assert (restarted.trainer.resume, where) == ("auto", None)  # step 0, with the logs cut back to nothing
    saved = _save(tmp_path, 4)
    restarted, where = restart_recipe(cfg, tmp_path, 0)
    assert (restarted.trainer.resume, where) == (str(saved), saved)
    assert cfg.trainer.resume == "never"  # the run's own recipe is left as it was
    elsewhere = _save(tmp_path / "other", 6)  # the run began from another run's step 6 and has not saved since
    external = OmegaConf.create({"trainer": {"resume": str(elsewhere), "output_dir": str(tmp_path)}})
    assert restart_recipe(external, tmp_path, 6) == (external, elsewhere)
