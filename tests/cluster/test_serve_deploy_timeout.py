"""``deploy`` never waits forever for a Serve application to run: a replica that no node
can host (or a warm-up that stalls) fails the deploy after ``deploy.start_timeout_s``
with what, where and how to fix, and the application is deleted (real Ray Serve on
127.0.0.1); DEPLOY_FAILED fails at once with Serve's message."""

from __future__ import annotations

import socket
from types import SimpleNamespace

import pytest

from rollart_sdk.serverless import deploy as serve_app
from rollart_sdk.serverless.deploy import DeployError, DeployOptions, deploy, replica_count


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def ray_local():
    import ray
    from ray import serve

    from rollart_sdk.ray_utils import init_ray

    init_ray(num_cpus=2, log_to_driver=False)
    yield _free_port()
    serve.shutdown()
    ray.shutdown()


@pytest.mark.timeout(180)  # the hang guard: before the fix, deploy waited forever
def test_unschedulable_replica_fails_the_deploy_in_time_and_deletes_the_app(ray_local):
    from ray import serve

    opts = DeployOptions(backend={"name": "rule", "options": {"mode": "success"}},
                         app="reward-too-big", port=ray_local, min_replicas=1,
                         max_replicas=1, num_cpus=64, start_timeout_s=4)
    with pytest.raises(DeployError) as info:
        deploy(opts, token=None)
    msg = str(info.value)
    assert "'reward-too-big'" in msg and "start_timeout_s=4" in msg, msg
    assert "1 STARTING" in msg and "num_cpus 64" in msg, msg  # Ray 2.60: infeasible = STARTING
    assert "the Ray cluster has 2 CPUs" in msg and "no node can ever host" in msg, msg
    assert "lower deploy.num_cpus" in msg and "raise deploy.start_timeout_s" in msg, msg
    assert "the application was deleted" in msg, msg
    assert "reward-too-big" not in serve.status().applications


def test_a_replica_that_fits_returns_once_it_runs(ray_local):
    from ray import serve

    opts = DeployOptions(backend={"name": "rule", "options": {"mode": "success"}},
                         app="reward-fits", port=ray_local, min_replicas=1, max_replicas=1,
                         num_cpus=0.5, start_timeout_s=120)
    try:
        assert deploy(opts, token=None) == f"http://127.0.0.1:{ray_local}/reward-fits"
        assert serve.status().applications["reward-fits"].status == "RUNNING"
        assert replica_count("reward-fits") == 1
    finally:
        serve.delete("reward-fits")


def test_serve_config_builds_hold_the_lock_while_a_monitor_polls(ray_local, monkeypatch):
    """Ray builds a RequestRouterConfig for a new deployment and for every serve.status()
    answer, registering and then unregistering a module with cloudpickle (a process-wide
    set): a ReplicaMonitor polling while deploy() built an app failed CI with "... is not
    registered for pickle by value". Every such build made through serve_app now holds
    SERVE_CONFIG_LOCK: checked on each registration while a thread polls throughout."""
    import threading

    from ray import serve
    from ray.serve import config as serve_config

    real = serve_config.cloudpickle.register_pickle_by_value
    held: list[tuple[str, bool]] = []

    def spy(module):
        held.append((threading.current_thread().name,
                     serve_app.SERVE_CONFIG_LOCK._is_owned()))
        return real(module)

    monkeypatch.setattr(serve_config.cloudpickle, "register_pickle_by_value", spy)
    stop = threading.Event()
    polls: list[int] = []
    errors: list[BaseException] = []

    def poll():
        while not stop.is_set():
            try:
                polls.append(sum(serve_app.replica_counts(["reward-locked"]).values()))
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
                return

    poller = threading.Thread(target=poll, name="poller", daemon=True)
    poller.start()
    opts = DeployOptions(backend={"name": "rule", "options": {"mode": "success"}},
                         app="reward-locked", port=ray_local, min_replicas=1,
                         max_replicas=1, num_cpus=0.5, start_timeout_s=120)
    try:
        deploy(opts, token=None)
    finally:
        stop.set()
        poller.join(60)
        serve.delete("reward-locked")
    assert not errors, errors
    assert len(polls) >= 2 and polls[-1] == 1, polls  # it polled across the deploy
    threads = {name for name, _ in held}
    assert {"poller", threading.current_thread().name} <= threads, threads
    assert all(owned for _, owned in held), held


def _status(state: str, message: str = "", dep_message: str = "") -> SimpleNamespace:
    dep = SimpleNamespace(status="UNHEALTHY", replica_states={"STARTING": 1},
                          message=dep_message)
    return SimpleNamespace(status=state, message=message, deployments={"d": dep})


def test_deploy_failed_raises_at_once_with_serves_message(monkeypatch):
    from ray import serve

    calls: list[str] = []
    states = iter([_status("DEPLOYING"), _status("DEPLOY_FAILED", "boom in __init__",
                                                 "replica raised ValueError('bad')")])
    monkeypatch.setattr(serve, "status", lambda: SimpleNamespace(
        applications={"reward-rule": next(states)}))
    monkeypatch.setattr(serve, "delete", calls.append)
    monkeypatch.setattr(serve_app, "POLL_S", 0.01)
    monkeypatch.setattr(serve_app, "_cluster_cpus", lambda n: "the Ray cluster has 2 CPUs")
    opts = DeployOptions(backend={"name": "rule", "options": {"mode": "success"}},
                         min_replicas=1, start_timeout_s=300)
    # Two statuses only: a third poll (not stopping at DEPLOY_FAILED) would raise
    # StopIteration, not DeployError.
    with pytest.raises(DeployError, match="failed to deploy") as info:
        serve_app.wait_running(opts)
    msg = str(info.value)
    assert "boom in __init__" in msg and "replica raised ValueError('bad')" in msg, msg
    assert "1 STARTING" in msg and "fix deploy.backend" in msg, msg
    assert calls == ["reward-rule"]


def test_an_app_deleted_meanwhile_is_an_error_not_a_wait(monkeypatch):
    from ray import serve

    monkeypatch.setattr(serve, "status", lambda: SimpleNamespace(applications={}))
    monkeypatch.setattr(serve, "delete", lambda name: pytest.fail("nothing to delete"))
    opts = DeployOptions(backend={"name": "rule", "options": {"mode": "success"}},
                         start_timeout_s=300)
    with pytest.raises(DeployError, match="NOT_STARTED.*does not exist"):
        serve_app.wait_running(opts)
