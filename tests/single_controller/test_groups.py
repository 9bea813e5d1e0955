"""Colocation, custom dispatch modes, @ray.remote classes, resource pools, and error reporting."""

from __future__ import annotations

import time

import pytest
import ray

from rlhfctl.single_controller import (
    ClassWithInitArgs,
    Dispatch,
    LocalWorkerGroup,
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    ResourcePoolError,
    WorkerDiedError,
    WorkerMethodError,
    WorkerTimeoutError,
    get_dispatch_spec,
    register,
    register_dispatch_mode,
)
from tests.single_controller.sample_workers import CustomModeWorker, EchoWorker, OtherRoleWorker, merge_sum, split_by_parity


def test_colocated_roles_share_one_process_per_rank_and_keep_their_own_methods(ray_session):
    pool = RayResourcePool([2], name="colocated")
    groups = RayWorkerGroup.create_colocated(
        pool, {"echo": RayClassWithInitArgs(EchoWorker), "other": RayClassWithInitArgs(OtherRoleWorker)}
    )
    try:
        echo, other = groups["echo"], groups["other"]
        echo_pids = [d["pid"] for d in echo.describe_process()]
        assert other.pid() == echo_pids
        assert len(set(echo_pids)) == 2
        # Same method name, each role with its own dispatch mode.
        assert echo.rank_and_arg("v") == [(0, "v", None), (1, "v", None)]
        assert other.rank_and_arg(["a", "b", "c", "d"]) == [(0, "a"), (0, "b"), (1, "c"), (1, "d")]
        assert not hasattr(echo, "pid") or echo.pid is None
    except AttributeError as error:
        assert "no registered method 'pid'" in str(error)
    finally:
        echo.shutdown()
        pool.release()


def test_hosts_get_one_actor_method_per_role_method_and_ambiguous_names_fall_back_to_call():
    from rlhfctl.single_controller import Dispatch, Worker, register
    from rlhfctl.single_controller.host import ClassWithInitArgs, WorkerHost, host_class_for

    class A(Worker):
        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        def b__c(self):
            return "a.b__c"

        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        def plain(self):
            return "a.plain"

    class AB(Worker):
        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        def c(self):
            return "a__b.c"

    host_cls = host_class_for({"a": ClassWithInitArgs(A), "a__b": ClassWithInitArgs(AB)})
    assert issubclass(host_cls, WorkerHost) and host_cls.__name__ == "WorkerHost"
    assert hasattr(host_cls, "a__plain")
    assert not hasattr(host_cls, "a__b__c")  # "a" + "b__c" and "a__b" + "c" would share it
    host = host_cls()
    host.workers = {"a": A(), "a__b": AB()}
    assert host.a__plain() == "a.plain"
    assert host.call("a", "b__c") == "a.b__c" and host.call("a__b", "c") == "a__b.c"
    assert [role_method[:2] for role_method in host.drain_spans()] == [("a", "plain"), ("a", "b__c"), ("a__b", "c")]


@pytest.mark.parametrize("backend", ["ray", "local"])
def test_custom_dispatch_mode_from_a_dict(ray_session, backend):
    pool = RayResourcePool([3], name="custom")
    if backend == "ray":
        group = RayWorkerGroup(pool, RayClassWithInitArgs(CustomModeWorker), role="custom")
    else:
        group = LocalWorkerGroup(pool, ClassWithInitArgs(CustomModeWorker), role="custom")
    try:
        assert group.total(list(range(10))) == sum(range(10))
    finally:
        group.shutdown()
        pool.release()


def test_register_dispatch_mode_adds_a_named_mode():
    mode = register_dispatch_mode("by_parity", split_by_parity, merge_sum)
    assert Dispatch.BY_PARITY is mode

    class ParityWorker(EchoWorker):
        @register(dispatch_mode=Dispatch.BY_PARITY)
        def total(self, values):
            return sum(values) * (self.rank + 1)

    group = LocalWorkerGroup(2, ClassWithInitArgs(ParityWorker), role="parity")
    # rank 0 gets [0, 2, 4] -> 6, rank 1 gets [1, 3] -> 4 * 2
    assert group.total([0, 1, 2, 3, 4]) == 6 + 8
    with pytest.raises(ValueError, match="built-in"):
        register_dispatch_mode("all_to_all", split_by_parity, merge_sum)


def test_register_attaches_a_readable_spec():
    spec = get_dispatch_spec(EchoWorker.rank_zero_shard)
    assert spec.describe() == {
        "dispatch_mode": "ALL_TO_ALL",
        "execute_mode": "RANK_ZERO",
        "blocking": True,
        "materialize_futures": True,
    }
    assert get_dispatch_spec(EchoWorker.__init__) is None


def test_a_ray_remote_class_is_accepted(ray_session):
    remote_cls = ray.remote(EchoWorker)
    pool = RayResourcePool([1], name="remote-cls")
    group = RayWorkerGroup(pool, RayClassWithInitArgs(remote_cls, offset=3), role="r")
    try:
        assert group.environment()[0]["offset"] == 3
    finally:
        group.shutdown()
        pool.release()


@pytest.mark.parametrize("name", ["WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"])
def test_env_vars_may_not_set_a_variable_the_group_sets_itself(name):
    spec = RayClassWithInitArgs(EchoWorker)
    with pytest.raises(ValueError, match=f"env_vars sets {name}, which the worker group sets itself"):
        spec.with_options(env_vars={name: "100", "OTHER": "1"})
    assert spec.env_vars == {}  # nothing half-applied


def test_every_reserved_variable_is_set_by_the_group_and_other_env_vars_reach_the_workers(ray_session):
    from rlhfctl.single_controller.worker import GROUP_ENV_VARS

    pool = RayResourcePool([1], name="env-vars")
    group = RayWorkerGroup(pool, RayClassWithInitArgs(EchoWorker).with_options(env_vars={"RLHFCTL_TEST_FLAG": "on"}),
                           role="env")
    try:
        seen = group.environment()[0]
    finally:
        group.shutdown()
        pool.release()
    assert seen["RLHFCTL_TEST_FLAG"] == "on"
    assert all(seen[name] is not None for name in GROUP_ENV_VARS), seen
    assert seen["WORLD_SIZE"] == "1" and seen["RANK"] == "0"


@pytest.mark.parametrize("backend", ["ray", "local"])
def test_worker_exception_names_class_method_and_rank_with_traceback(echo_groups, backend):
    group = echo_groups(backend, 3)
    with pytest.raises(WorkerMethodError) as caught:
        group.fail_on(2)
    error = caught.value
    assert error.rank == 2 and error.method == "fail_on" and error.worker_class == "EchoWorker"
    message = str(error)
    assert "echo.fail_on failed on rank 2 (EchoWorker)" in message
    assert "boom on rank 2" in message
    assert "sample_workers.py" in message  # the worker's own traceback
    assert group.rank_and_arg(1)[0][1] == 1  # the group still works afterwards


@pytest.mark.parametrize("backend", ["ray", "local"])
def test_a_worker_user_error_reaches_the_driver_as_a_flag(echo_groups, backend):
    from rlhfctl.cli.errors import EXIT_INTERNAL, EXIT_USER, exit_code_for, user_message

    group = echo_groups(backend, 2)
    with pytest.raises(WorkerMethodError) as caught:
        group.fail_with_user_error_on(1)
    assert caught.value.user_error is True and exit_code_for(caught.value) == EXIT_USER
    assert user_message(caught.value) == "echo.fail_with_user_error_on (rank 1): SampleSettingError: echo.offset: not usable on rank 1"
    with pytest.raises(WorkerMethodError) as caught:
        group.fail_on(0)
    assert caught.value.user_error is False and exit_code_for(caught.value) == EXIT_INTERNAL


def test_dead_worker_is_reported_with_its_rank_not_a_hang(ray_session):
    pool = RayResourcePool([2], name="dying")
    group = RayWorkerGroup(pool, RayClassWithInitArgs(EchoWorker), role="dying", call_timeout_s=60)
    started = time.monotonic()
    with pytest.raises(WorkerDiedError, match=r"dying rank 0 died during dying.exit_process"):
        group.exit_process()
    assert time.monotonic() - started < 60
    group.shutdown()
    pool.release()


def test_a_slow_call_times_out_with_the_pending_ranks(echo_groups):
    group = echo_groups("ray", 2)
    group.call_timeout_s = 1
    try:
        with pytest.raises(WorkerTimeoutError, match=r"echo.sleep did not finish within 1 s; ranks still running: \[0, 1\]"):
            group.sleep(3)
    finally:
        group.call_timeout_s = 600
    time.sleep(3)  # let the sleeping ranks finish before other tests use the group


def test_pool_larger_than_the_cluster_fails_fast_naming_what_was_asked(ray_session):
    pool = RayResourcePool([1000], name="huge")
    started = time.monotonic()
    with pytest.raises(ResourcePoolError, match=r"resource pool 'huge'.*CPU 500 needed"):
        RayWorkerGroup(pool, RayClassWithInitArgs(EchoWorker), role="huge")
    assert time.monotonic() - started < 10


def test_default_pools_fit_a_small_local_ray(ray_session):
    pools = [RayResourcePool([3], name="a"), RayResourcePool([3], name="b")]
    groups = [RayWorkerGroup(pool, RayClassWithInitArgs(EchoWorker), role=f"g{i}") for i, pool in enumerate(pools)]
    try:
        assert [len(g.describe_process()) for g in groups] == [3, 3]
    finally:
        for group, pool in zip(groups, pools):
            group.shutdown()
            pool.release()


def test_describe_process_reports_the_torch_threads_the_group_set(ray_session):
    pool = RayResourcePool([1], name="threads")
    group = RayWorkerGroup(pool, RayClassWithInitArgs(EchoWorker).with_options(num_threads=3), role="threads")
    try:
        assert [d["torch_threads"] for d in group.describe_process()] == [3]
    finally:
        group.shutdown()
        pool.release()


def test_registering_a_reserved_name_is_refused():
    class BadWorker(EchoWorker):
        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        def shutdown(self):
            return None

    with pytest.raises(TypeError, match="reserved"):
        LocalWorkerGroup(1, ClassWithInitArgs(BadWorker))
