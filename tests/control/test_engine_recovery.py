"""Engine worker death on the real pipeline, in-process (torch engines and trainer, transport
``local``): the dead engine's requests go to the other engine, its "restarted" process
refuses to serve until EngineRecovery reloaded the served version, its binding record
counts the restart, it rejoins the routes, and the run completes with every trajectory
accounted for and every engine on one version.

In one process nothing can be SIGKILLed: the death is Ray's as the control plane sees it.
The victim's calls fail with an error named ``ActorDiedError`` (what ``ray`` raises for a
dead actor; the proxy reads errors by class name), and the handle then points at a fresh
``EngineWorker`` built from the same arguments with ``restarted`` set (what Ray's
``max_restarts`` gives: ``__init__`` again, initial weights). The real SIGKILL of a Ray
engine worker's process is ``test_failures_ray.py::test_killing_an_engine_worker_mid_run_is_survived``.
"""

from __future__ import annotations

import asyncio
import copy

import pytest
from control_configs import two_tasks

from rollart_sdk.cluster.roles import EngineRestartedError, EngineWorker
from rollart_sdk.cluster.spawn import LocalSpawner
from rollart_sdk.config import load_config
from rollart_sdk.control.proxy import is_worker_death
from rollart_sdk.job import build_job, run_job

pytestmark = pytest.mark.timeout(600)


class ActorDiedError(RuntimeError):
    """Stands in for ``ray.exceptions.ActorDiedError`` (matched by class name)."""


def _recording_cluster(made):
    orig = LocalSpawner.cluster

    def cluster(self, cls, name, init_args, *a, **kw):
        handles = orig(self, cls, name, init_args, *a, **kw)
        for h in handles:
            made[h.name] = (cls, init_args)
        return handles

    return cluster


def build(tmp_path, monkeypatch, mode="async", steps=6):
    made: dict[str, tuple] = {}
    monkeypatch.setattr(LocalSpawner, "cluster", _recording_cluster(made))
    data = two_tasks(train={"steps": steps, "bucket_mb": 1, "save_final_model": False})
    cfg, lines = load_config(data=copy.deepcopy(data),
                             overrides=[f"output_dir={tmp_path}", f"rollout.mode={mode}"])
    job = build_job(cfg, lines, in_process=True, log=lambda *a: None)
    return job, made


def kill_after(job, made, name, version):
    """At the first generate call on engine ``name`` once the engines serve ``version``,
    its process "dies": that call and every call in flight on it fail, and the handle
    points at a restarted process (initial weights, version 0)."""
    handle = job.pipeline.proxy.workers[name]
    old = handle.target
    state = {"dead": False, "new": None, "at": None, "served": []}
    generate = old.generate

    def restart():
        from rollart_sdk.cluster.worker import WorkerContext, bound_worker_class

        cls, init_args = made[name]
        ctx = WorkerContext(old.rank, old.world_size, cls.role, "gen", name,
                            {"worker": name}, {})
        new = bound_worker_class(cls)(ctx, *init_args)
        new.restarted = True  # what _was_restarted() says in a restarted Ray actor
        engine_generate = new.engine.generate

        async def recorded(request, **kw):  # the weights it generates on, and the run's
            state["served"].append((new.engine.version, job.pipeline.engine_version))
            return await engine_generate(request, **kw)

        new.engine.generate = recorded
        state["dead"], state["new"] = True, new
        handle.target = new

    async def dying_generate(request, kv=None):
        if state["dead"]:
            raise ActorDiedError(f"{name}: the actor died unexpectedly")
        if job.pipeline.engine_version >= version:
            state["at"] = job.pipeline.engine_version
            restart()
            raise ActorDiedError(f"{name}: the actor died unexpectedly")
        result = await generate(request, kv)
        if state["dead"]:  # in flight when the process went
            raise ActorDiedError(f"{name}: the actor died unexpectedly")
        return result

    old.generate = dying_generate
    return state


def accounted(summary):
    return summary["launched"] == summary["trained"] + sum(summary["dropped"].values())


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_a_dead_engine_is_restarted_reloaded_and_rejoins(tmp_path, monkeypatch, mode):
    import json

    job, made = build(tmp_path, monkeypatch, mode=mode)
    state = kill_after(job, made, "gen-1", version=2)
    try:
        records = run_job(job, 6, progress=False)
    finally:
        job.close()
    p = job.pipeline
    assert len(records) == 6
    assert state["dead"], "the engine was never killed: too few requests reached it"
    # After the restart it generated only on the version every engine serves (reloaded,
    # not its initial weights, version 0); one newer at most: a request that reached the
    # engine between a swap's commit and the pipeline recording the new version.
    assert state["at"] >= 2 and state["served"], state
    assert all(served <= mine <= served + 1 for mine, served in state["served"]), state["served"]
    rec = p.recovery.summary()
    assert rec["deaths"] == {"gen-1": 1} and rec["recovered"] == {"gen-1": 1}, rec
    assert rec["failed"] == {}
    assert p.proxy.rerouted >= 1 and not p.proxy.down
    new = state["new"]
    assert new.restarted is False  # reloaded, then serving again
    # Every engine (the restarted one included) serves the version the pipeline says.
    assert {h.target.engine.version for h in p.proxy.workers.values()} == {p.engine_version}
    # The restarted engine served requests after it rejoined.
    assert new.engine.stats()["tokens_generated"] > 0
    summary = json.loads((job.run_dir.path / "summary.json").read_text())
    assert accounted(summary), summary
    assert summary["engine_versions"] == {"gen-0": p.engine_version, "gen-1": p.engine_version}
    assert summary["engine_recovery"]["down_at_end"] == {}
    bindings = json.loads((job.run_dir.path / "bindings.json").read_text())
    assert [b.get("restarts", 0) for b in bindings if b["worker"] == "gen-1"] == [1]
    events = [json.loads(x) for x in (job.run_dir.path / "events.jsonl").read_text().splitlines()]
    spans = [e["span"] for e in events if e.get("worker") == "gen-1"]
    assert "worker_died" in spans and "worker_rejoined" in spans


def test_a_restarted_engine_refuses_work_until_it_is_reloaded(tmp_path, monkeypatch):
    job, made = build(tmp_path, monkeypatch, steps=1)
    try:
        cls, init_args = made["gen-0"]
        old = job.pipeline.proxy.workers["gen-0"].target
        from rollart_sdk.cluster.worker import WorkerContext, bound_worker_class

        ctx = WorkerContext(0, 2, cls.role, "gen", "gen-0", {"worker": "gen-0"}, {})
        new = bound_worker_class(cls)(ctx, *init_args)
        assert isinstance(new, EngineWorker) and new.restarted is False  # not a Ray restart
        new.restarted = True
        for call in (lambda: new.generate(None), lambda: new.weights_status(),
                     lambda: new.commit_weights(), lambda: new.prefill_kv(None)):
            with pytest.raises(EngineRestartedError) as err:
                asyncio.run(call())
            assert is_worker_death(err.value)  # the proxy and WeightSync mark it down
        assert asyncio.run(new.restart_state()) == {"version": 0, "restarted": True}
        # Reload: the served version's manifest (none at version 0), then it serves.
        assert asyncio.run(new.reload(None)) == 0 and new.restarted is False
        assert asyncio.run(new.weights_status())["engine_version"] == 0
        assert old.restarted is False
    finally:
        job.close()


def test_summary_asks_every_engine_and_names_the_one_that_failed():
    """summary.json's ``engine_versions`` / ``engines``: one entry per engine, the error in
    place of a dead engine's answer (versions: the message; stats: {"error": message})."""
    from types import SimpleNamespace

    from rollart_sdk.cluster.handles import WorkerHandle
    from rollart_sdk.job import _engine_stats, _engine_versions

    class Engine:  # the worker's side of the two calls, behind a real handle
        def __init__(self, fail=None):
            self.fail, self.asked = fail, []

        def _answer(self, method):
            self.asked.append(method)
            if self.fail:
                raise self.fail
            return {"engine_version": "4", "tokens_generated": 7}

        def weights_status(self):
            return self._answer("weights_status")

        def stats(self):
            return self._answer("stats")

    engines = [Engine(), Engine(RuntimeError("actor died " + "x" * 600))]
    handles = [WorkerHandle(f"gen-{i}", e, is_ray=False) for i, e in enumerate(engines)]
    p = SimpleNamespace(weight_sync=SimpleNamespace(engines=handles))
    versions = _engine_versions(p)
    assert versions["gen-0"] == 4
    assert versions["gen-1"].startswith("RuntimeError: actor died") and len(versions["gen-1"]) == 300
    stats = _engine_stats(p)
    assert stats["gen-0"] == {"engine_version": "4", "tokens_generated": 7}
    assert set(stats["gen-1"]) == {"error"} and len(stats["gen-1"]["error"]) == 500
    assert [e.asked for e in engines] == [["weights_status", "stats"]] * 2


class EngineDeadError(RuntimeError):
    """Stands in for vLLM's ``EngineDeadError`` (its engine core process is gone), which
    an engine backend raises from a live worker (matched by class name)."""


def test_an_engine_whose_backend_died_is_taken_out_not_retried(tmp_path, monkeypatch):
    """The backend's own engine dies inside a live worker (vLLM's engine core killed): the
    worker answers every later call with rollart's ``EngineDeadError`` (a worker death
    to the proxy), so its requests go to the other engine, and EngineRecovery does not
    reload it in place. On Ray the process exits and is restarted (the vLLM suite's
    ``test_engine_core_killed.py`` kills a real engine core); in one process nothing
    restarts it: it stays out, and the run completes with everything accounted for."""
    import json

    from rollart_sdk.errors import EngineDeadError as Dead
    from rollart_sdk.errors import is_engine_dead

    job, _ = build(tmp_path, monkeypatch, steps=6)
    worker = job.pipeline.proxy.workers["gen-1"].target
    backend = worker.engine.generate
    died: list[int] = []

    async def generate(request, **kw):
        if died or job.pipeline.engine_version >= 2:
            died.append(job.pipeline.engine_version)
            raise EngineDeadError("EngineCore encountered an issue")
        return await backend(request, **kw)

    worker.engine.generate = generate
    try:
        records = run_job(job, 6, progress=False)
    finally:
        job.close()
    assert len(records) == 6 and died
    assert worker.dead is not None and "EngineCore encountered an issue" in worker.dead
    for call in (lambda: worker.generate(None), lambda: worker.restart_state(),
                 lambda: worker.reload(None), lambda: worker.commit_weights()):
        with pytest.raises(Dead) as err:
            asyncio.run(call())
        assert is_worker_death(err.value) and is_engine_dead(err.value)
    p = job.pipeline
    rec = p.recovery.summary()
    assert rec["deaths"] == {"gen-1": 1} and rec["recovered"] == {}, rec
    assert rec["failed"]["gen-1"].startswith("EngineLostError"), rec  # given up at once
    assert p.proxy.rerouted >= 1 and "gen-1" in p.proxy.down
    summary = json.loads((job.run_dir.path / "summary.json").read_text())
    assert accounted(summary), summary
    assert not [r for r in summary["dropped"] if r.startswith("generate_failed")], summary


def test_an_error_raised_from_an_engine_death_is_one():
    """The stager wraps a failed ``load_weights`` in ``WeightSyncError`` (raised from the
    engine's error): a core killed during a weight swap is still an engine death."""
    from rollart_sdk.errors import is_engine_dead
    from rollart_sdk.weights.buckets import WeightSyncError

    def wrapped(cause):
        try:
            try:
                raise cause
            except Exception as exc:
                raise WeightSyncError(2, f"engine.load_weights raised {exc}") from exc
        except WeightSyncError as err:
            return err

    assert is_engine_dead(wrapped(EngineDeadError("EngineCore encountered an issue")))
    assert not is_engine_dead(wrapped(RuntimeError("shape mismatch")))
    assert not is_engine_dead(WeightSyncError(2, "a bucket's checksum"))
