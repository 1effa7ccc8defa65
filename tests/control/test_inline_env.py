"""tasks[].env_host: cheap envs inline in the EnvManagers' process, the rest on env workers."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
from control_configs import TWO_TASKS

from rollart_sdk.cluster.envs import EnvCallError, EnvHung, InlineEnvWorker, ThreadEnvWorker
from rollart_sdk.cluster.envs.hosting import inline_tasks, thread_tasks
from rollart_sdk.cluster.envs.thread import MAX_HUNG_CALLS
from rollart_sdk.config import load_config
from rollart_sdk.errors import ConfigError
from rollart_sdk.job import build_job, env_summary, run_job


def _config(tmp_path, frozen_host: str, arith_host: str = "worker"):
    data = copy.deepcopy(TWO_TASKS)
    data["tasks"][0]["env_host"] = frozen_host
    data["tasks"][1]["env_host"] = arith_host
    return load_config(data=data, overrides=[f"output_dir={tmp_path}", "rollout.mode=sync"])


@pytest.mark.parametrize("host", ["inline", "thread"])
def test_in_process_task_runs_beside_a_worker_task(tmp_path, host):
    cfg, lines = _config(tmp_path, host)
    job = build_job(cfg, lines, in_process=True, log=lambda *a: None)
    try:
        sched = job.pipeline.scheduler
        (frozen,) = sched.env_by_tag["FrozenLake"]
        (arith,) = sched.env_by_tag["Arithmetic"]
        assert isinstance(frozen.target, InlineEnvWorker if host == "inline" else ThreadEnvWorker)
        # inline: called on the event loop; thread: each call on the loop's thread pool
        assert frozen.inline == (host == "inline") and frozen.name == f"env-{host}"
        assert not arith.inline and type(arith.target).__name__ != "InlineEnvWorker"
        records = run_job(job, 2, progress=False)
    finally:
        job.close()
    assert len(records) == 2
    summary = env_summary(job)
    # Both tasks' envs were built, each by its own host; the inline ones in this process.
    assert summary["constructions"]["FrozenLake"] > 0
    assert summary["constructions"]["Arithmetic"] > 0
    assert frozen.target.stats()["constructions"] == {
        "FrozenLake": summary["constructions"]["FrozenLake"]}
    assert frozen.target.stats()["live"] == 0  # every pooled env closed at run end
    # Only the worker-hosted task has an environment-role binding.
    roles = [b["role"] for b in job.spawner.bindings()]
    assert roles.count("environment") == 1


def test_inline_env_errors_and_close_are_reported():
    class Boom:
        def reset(self, *, seed=None, options=None):
            raise ValueError(f"bad seed {seed}")

        def step(self, action):
            return "o", 0.0, False, False, {}

        def close(self):
            raise OSError("close failed")

    class Desc:
        @staticmethod
        def load():
            return Boom

    class Opts:
        @staticmethod
        def model_dump():
            return {}

    w = InlineEnvWorker({"T": (Desc, Opts)})
    with pytest.raises(EnvCallError, match="ValueError: bad seed 3"):
        w.reset("e1", "T", 3)
    with pytest.raises(KeyError, match="no env 'e2'"):
        w.step("e2", "x")
    with pytest.raises(KeyError, match="no inline env"):
        w.reset("e3", "Other", 0)
    assert w.close("e1") == "env close raised OSError: close failed"
    assert w.close("e1") is None and w.stats()["live"] == 0


def test_auto_is_inline_only_for_declared_cheap_envs_without_faults(tmp_path):
    cfg, _ = _config(tmp_path, "auto", "auto")
    described = {"FrozenLake": {"step_cost": "cheap"}, "Arithmetic": {"step_cost": None}}
    assert inline_tasks(cfg, described) == {"FrozenLake"}
    cfg, _ = _config(tmp_path, "thread", "auto")
    assert inline_tasks(cfg, described) == set() and thread_tasks(cfg) == {"FrozenLake"}
    data = copy.deepcopy(TWO_TASKS)
    data["output_dir"] = str(tmp_path)
    data["tasks"][0]["env"]["faults"] = {"step_error": 0.1}
    cfg, _ = load_config(data=data)
    assert inline_tasks(cfg, described) == set()  # faults need a killable worker host
    for host in ("inline", "thread"):
        data["tasks"][0]["env_host"] = host
        with pytest.raises(ConfigError, match=f"env_host {host} cannot contain injected faults"):
            load_config(data=data)


def test_inline_envs_build_in_the_callers_process():
    class Where:
        def __init__(self):
            self.pid = os.getpid()

        def reset(self, *, seed=None, options=None):
            return f"pid={self.pid}", {}

    class Desc:
        @staticmethod
        def load():
            return Where

    class Opts:
        @staticmethod
        def model_dump():
            return {}

    obs, _ = InlineEnvWorker({"T": (Desc, Opts)}).reset("e", "T", 0)
    assert obs == f"pid={os.getpid()}"


def _spec(cls):
    desc = SimpleNamespace(load=lambda: cls)
    return {"T": (desc, SimpleNamespace(model_dump=dict))}


def test_thread_host_refuses_calls_while_too_many_hang():
    # A thread-hosted call that hangs is given up at its timeout; its thread runs on (it
    # cannot be killed). At MAX_HUNG_CALLS such calls the host refuses new ones at once,
    # naming the fix, instead of leaking one thread per hang; a hung call that returns
    # frees its place. The hung threads are the host's own: the loop's default executor
    # (rewards, engine recovery) keeps its threads, and asyncio.run's end does not wait.
    release = threading.Event()

    class Blocking:
        def reset(self, *, seed=None, options=None):
            return "start", {}

        def step(self, action):
            if action == "hang":
                release.wait(60)  # bounded; the test sets it
            return "ok", 1.0, False, False, {}

    w = ThreadEnvWorker(_spec(Blocking))
    n = MAX_HUNG_CALLS

    async def hang_them():
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=2))
        for i in range(n + 1):
            assert await w.reset(f"e{i}", "T", i, timeout_s=5) == ("start", {})
        t0 = time.monotonic()
        results = await asyncio.gather(*(w.step(f"e{i}", "hang", timeout_s=0.05)
                                         for i in range(n)), return_exceptions=True)
        assert time.monotonic() - t0 < 5  # given up at the timeout, not at the env's return
        assert all(isinstance(r, EnvHung) for r in results), results
        assert "no step within 0.05s from the env of task 'T'" in str(results[0])
        # The loop's default executor (2 threads here) lost none to the hung calls.
        assert await asyncio.wait_for(asyncio.gather(
            *(asyncio.to_thread(lambda: 7) for _ in range(4))), 5) == [7] * 4
        t0 = time.monotonic()
        with pytest.raises(EnvCallError) as refused:
            await w.step(f"e{n}", "fine", timeout_s=5)
        assert time.monotonic() - t0 < 1  # at once: it never reached the env
        assert not isinstance(refused.value, EnvHung)
        text = str(refused.value)
        assert text.startswith(f"refused: {n} env calls of env_host: thread task(s) 'T' hung")
        assert "use env_host: worker" in text and f"({n} step;" in text
        with pytest.raises(EnvCallError, match="refused: "):
            await w.reset("new", "T", 0, timeout_s=5)
        return text

    try:
        t0 = time.monotonic()
        text = asyncio.run(hang_them())
        assert time.monotonic() - t0 < 15  # the loop closed with the calls still hung
        stats = w.stats()
        assert stats["hung"] == n and stats["hung_peak"] == n
        assert stats["timed_out"] == n and stats["refused"] == 2
        assert stats["constructions"] == {"T": n + 1}

        # How the EnvManager words the two drops: a timeout, and the refusal's text.
        from rollart_sdk.control.env_manager import _env_reason

        assert _env_reason("step", EnvHung("no step", killed=False), 0.05) == (
            "env_step_timeout: no step within 0.05s (env_host: thread: the call was given "
            "up; its thread runs on, it cannot be killed)")  # not "its process was killed"
        assert _env_reason("reset", EnvHung("outlived"), 5).endswith(
            "(the env's process was killed)")  # a worker host's
        assert _env_reason("step", TimeoutError(), 5).endswith("(its env host did not answer)")
        reason = _env_reason("step", EnvCallError(text), 5)
        assert reason.startswith("env_step_failed: EnvCallError: refused: ")
        # The watchdog quotes the first 300 characters of a reason: the fix is in them.
        assert "use env_host: worker" in reason[:300]
    finally:
        release.set()
    deadline = time.monotonic() + 10
    while w.stats()["hung"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert w.stats()["hung"] == 0  # the hung calls returned: they left the count

    async def admitted_again():
        assert await w.step(f"e{n}", "fine", timeout_s=5) == ("ok", 1.0, False, False, {})
        assert await asyncio.gather(*(w.close(f"e{i}") for i in range(n + 1))) == [None] * (n + 1)

    asyncio.run(admitted_again())
    assert w.stats()["live"] == 0 and w.stats()["closed"] == n + 1 and w.stats()["refused"] == 2


@pytest.mark.timeout(60)  # a hang guard: a finished call whose hand-over is lost never returns
def test_thread_host_hands_every_result_to_its_caller_and_counts_none_left_behind():
    # A host thread hands finished calls to the loop in batches (one wake-up for calls
    # that end together). Every caller gets its own result, however the calls interleave,
    # and a call its caller gave up (cancelled, or past its timeout) leaves the count of
    # calls in flight once it returns, or at once if no thread had started it.
    import random

    ran = []

    class Echo:
        def reset(self, *, seed=None, options=None):
            return f"start-{seed}", {}

        def step(self, action):
            time.sleep(0.3 if action == "slow" else random.random() * 0.002)
            ran.append(action)
            return action, 0.0, False, False, {}

    w = ThreadEnvWorker(_spec(Echo))

    async def go():
        n = 64
        assert await asyncio.gather(*(w.reset(f"e{i}", "T", i) for i in range(n))) == [
            (f"start-{i}", {}) for i in range(n)]
        for _ in range(5):  # rounds of calls ending together and apart
            out = await asyncio.gather(*(w.step(f"e{i}", f"a{i}") for i in range(n)))
            assert [o[0] for o in out] == [f"a{i}" for i in range(n)]
        given_up = [asyncio.ensure_future(w.step(f"e{i}", f"x{i}")) for i in range(n)]
        await asyncio.sleep(0)
        for task in given_up:
            task.cancel()
        assert all(isinstance(r, asyncio.CancelledError) for r in
                   await asyncio.gather(*given_up, return_exceptions=True))
        late = await asyncio.gather(*(w.step(f"e{i}", "slow", timeout_s=0.1)
                                      for i in range(8)), return_exceptions=True)
        assert all(isinstance(r, EnvHung) for r in late), late
        deadline = time.monotonic() + 10
        while w._calls and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    asyncio.run(go())
    assert not w._calls  # none left in flight: every call returned or never started
    stats = w.stats()
    assert stats["hung"] == 0
    assert ran.count("slow") == 8  # a call past its timeout (started) ran to its end
    cancelled = [a for a in ran if a.startswith("x")]
    assert len(cancelled) == len(set(cancelled))  # a call runs at most once


def test_thread_host_says_when_it_cannot_start_a_thread_and_goes_on(monkeypatch):
    # A thread that cannot start ("can't start new thread": the process is out of them)
    # fails that call with the reason, at once; the host's count of idle threads stays
    # right (the call stays queued with no thread promised to it, and the thread that
    # takes it takes the next one too), so calls that need two threads at once get two.
    both = threading.Barrier(2, timeout=5)

    class Echo:
        def reset(self, *, seed=None, options=None):
            return f"start-{seed}", {}

        def step(self, action):
            if action == "together":
                both.wait()  # returns only while another call runs on another thread
            return action, 0.0, False, False, {}

    w = ThreadEnvWorker(_spec(Echo))
    real_start = threading.Thread.start
    fails = {"left": 1}

    def start(self):
        if self.name.startswith("env-thread") and fails["left"]:
            fails["left"] -= 1
            raise RuntimeError("can't start new thread")
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)

    async def go():
        with pytest.raises(EnvCallError, match="could not start a thread for the env call: "
                                              "RuntimeError: can't start new thread"):
            await w.reset("e0", "T", 0, timeout_s=5)
        assert await w.reset("e1", "T", 1, timeout_s=5) == ("start-1", {})
        assert await w.reset("e2", "T", 2, timeout_s=5) == ("start-2", {})
        out = await asyncio.wait_for(asyncio.gather(
            w.step("e1", "together", timeout_s=8), w.step("e2", "together", timeout_s=8)), 10)
        assert [o[0] for o in out] == ["together", "together"]

    asyncio.run(go())
    assert not w._calls and w.stats()["hung"] == 0


def test_thread_host_reports_a_close_that_hangs():
    release = threading.Event()

    class StuckClose:
        def reset(self, *, seed=None, options=None):
            return "start", {}

        def close(self):
            release.wait(60)

    w = ThreadEnvWorker(_spec(StuckClose))
    import rollart_sdk.cluster.envs.thread as thread_host

    async def close_it():
        await w.reset("e", "T", 0, timeout_s=5)
        return await w.close("e")

    old = thread_host.CLOSE_TIMEOUT_S
    thread_host.CLOSE_TIMEOUT_S = 0.05
    try:
        assert asyncio.run(close_it()) == (
            "env close did not return within 0.05s (env_host: thread: its thread runs on, "
            "it cannot be killed)")
        assert w.stats()["timed_out"] == 1 and w.stats()["live"] == 0
    finally:
        thread_host.CLOSE_TIMEOUT_S = old
        release.set()


def test_a_first_reset_that_returns_after_its_env_was_closed_closes_what_it_built():
    # A thread-hosted first reset (it constructs the env) given up at its timeout: the
    # pool replaces the slot and closes the old id while the env does not exist yet. When
    # the stuck construction returns, the env it built must be closed, not kept unowned.
    release = threading.Event()
    closed: list[str] = []

    class SlowToBuild:
        def __init__(self):
            release.wait(60)  # bounded; the test sets it

        def reset(self, *, seed=None, options=None):
            return "start", {}

        def close(self):
            closed.append("closed")

    w = ThreadEnvWorker(_spec(SlowToBuild))

    async def main():
        with pytest.raises(EnvHung):
            await w.reset("T/env0.0", "T", 0, timeout_s=0.1)
        assert await w.close("T/env0.0") is None  # nothing built yet
        release.set()
        deadline = time.monotonic() + 30
        while w.stats()["hung"] and time.monotonic() < deadline:
            await asyncio.sleep(0.02)  # the given-up call runs on until it returns

    try:
        asyncio.run(main())
    finally:
        release.set()
    deadline = time.monotonic() + 30
    while not closed and time.monotonic() < deadline:
        time.sleep(0.02)
    stats = w.stats()
    assert closed == ["closed"] and w.stats()["live"] == 0, (closed, stats)
    assert stats["closed_late"] == 1 and stats["constructions"] == {"T": 1}, stats
    # A later generation of the slot is built and used as usual.
    assert asyncio.run(w.reset("T/env0.1", "T", 0, timeout_s=5)) == ("start", {})
    assert w.stats()["live"] == 1


HANG_ENVS = """
import threading

import gymnasium as gym
from pydantic import BaseModel, ConfigDict

RELEASE = threading.Event()  # the test sets it at its end: no thread outlives it


class HangOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")


class HangEnv(gym.Env):
    '''Odd seeds: the step hangs (until RELEASE); even seeds answer at once.'''

    action_vocabulary = None
    system_prompt = None

    def reset(self, *, seed=None, options=None):
        self.hang = (seed or 0) % 2 == 1
        return "say something", {}

    def step(self, action):
        if self.hang:
            RELEASE.wait(120)
        return "done", 1.0, True, False, {}
"""


@pytest.mark.timeout(300)  # a hang guard; the drop-rate reason is asserted below
def test_a_thread_hosted_env_that_keeps_hanging_stops_the_run_naming_the_fix(tmp_path,
                                                                           monkeypatch):
    # Half the steps hang for good. Each is given up at step_timeout_s; once MAX_HUNG_CALLS
    # hold their threads, every call is refused with the reason, and the drop-rate watchdog
    # stops the run with it (before: the pool's threads ran out, every thread-hosted env and
    # every asyncio.to_thread starved, and the run ended at the stall timeout, if at all).
    from rollart_sdk import hookimpl
    from rollart_sdk.control.watchdog import RunFailure
    from rollart_sdk.plugins import load_plugins

    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "rollart_test_hang_envs.py").write_text(HANG_ENVS)
    monkeypatch.syspath_prepend(str(mods))
    import rollart_test_hang_envs as hang_envs

    def rollart_register_envs(registry):
        registry.register("hang", factory="rollart_test_hang_envs:HangEnv",
                          options="rollart_test_hang_envs:HangOptions")

    registry = load_plugins(strict=True, extra={"test-hang": SimpleNamespace(
        rollart_register_envs=hookimpl(rollart_register_envs))}).registry
    data = copy.deepcopy(TWO_TASKS)
    data["roles"] = {"actor_gen": {"workers": 1}}
    data["tasks"] = [{"tag": "T", "env": {"name": "hang"}, "env_host": "thread",
                      "reward": {"name": "rule", "options": {"mode": "env_return"}},
                      "max_turns": 1, "system_prompt": None, "sampling": {"max_new_tokens": 2},
                      "step_timeout_s": 0.2}]
    out = tmp_path / "out"
    cfg, lines = load_config(data=data, overrides=[
        f"output_dir={out}", "rollout.mode=sync", "rollout.drop_window=16",
        "rollout.max_drop_rate=0.6", "rollout.stall_timeout_s=120"])
    job = build_job(cfg, lines, in_process=True, log=lambda *a: None, registry=registry)
    try:
        with pytest.raises(RunFailure) as err:
            run_job(job, 50, progress=False)
        host = job.pipeline.scheduler.env_workers[0].target
        stats = host.stats()
    finally:
        job.close()
        hang_envs.RELEASE.set()
        sys.modules.pop("rollart_test_hang_envs", None)
    text = str(err.value)
    assert err.value.task == "T" and "trajectories were dropped (rollout.max_drop_rate" in text
    assert "env_host: thread task(s) 'T' hung past their timeout" in text, text
    assert "use env_host: worker" in text
    assert isinstance(host, ThreadEnvWorker)
    assert stats["hung"] >= MAX_HUNG_CALLS and stats["refused"] > 0
    (run_dir,) = [p for p in out.iterdir() if p.is_dir() and not p.name.startswith(".")]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["envs"]["threads"]["env-thread"]["hung"] >= MAX_HUNG_CALLS
    assert summary["envs"]["threads"]["env-thread"]["refused"] == stats["refused"]
    assert summary["envs"]["threads"]["env-thread"]["closed_late"] == stats["closed_late"]
    # Every drop carries its reason: the hung calls' timeouts, then the refusals.
    assert summary["dropped"]["env_step_timeout"] >= MAX_HUNG_CALLS
    refusals = sum(n for k, n in summary["dropped"].items() if k.endswith("_failed"))
    assert refusals > 0
    assert summary["launched"] == summary["trained"] + sum(summary["dropped"].values())
    drops = [json.loads(x) for x in (run_dir / "drops.jsonl").read_text().splitlines()]
    assert any("refused: " in json.dumps(d) and "use env_host: worker" in json.dumps(d)
               for d in drops)


BIG_OBS_ENVS = """
import gymnasium as gym
from pydantic import BaseModel, ConfigDict


class BigOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BigObsEnv(gym.Env):
    '''Reliability probe 2e, per step: the first step answers a 1 MB observation.'''

    action_vocabulary = None
    system_prompt = None

    def reset(self, *, seed=None, options=None):
        return "say something", {}

    def step(self, action):
        return "x" * 1_000_000, 0.5, False, False, {}
"""


@pytest.mark.timeout(300)
def test_a_1mb_observation_at_a_step_ends_the_episode_at_the_context_budget(tmp_path,
                                                                           monkeypatch):
    """An env that answers 1 MB at its first step: the episode ends there, truncated at
    tasks[].max_context_tokens (said in its info), and what is trained is the turn the
    model took, not the megabyte; the run goes on and its accounting balances."""
    from rollart_sdk import hookimpl
    from rollart_sdk.plugins import load_plugins

    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "rollart_test_big_envs.py").write_text(BIG_OBS_ENVS)
    monkeypatch.syspath_prepend(str(mods))

    def rollart_register_envs(registry):
        registry.register("bigobs", factory="rollart_test_big_envs:BigObsEnv",
                          options="rollart_test_big_envs:BigOptions")

    registry = load_plugins(strict=True, extra={"test-big": SimpleNamespace(
        rollart_register_envs=hookimpl(rollart_register_envs))}).registry
    data = copy.deepcopy(TWO_TASKS)
    data["roles"] = {"actor_gen": {"workers": 1}}
    data["tasks"] = [{"tag": "T", "env": {"name": "bigobs"}, "env_host": "inline",
                      "reward": {"name": "rule", "options": {"mode": "env_return"}},
                      "max_turns": 3, "system_prompt": None, "sampling": {"max_new_tokens": 2},
                      "max_context_tokens": 256}]
    out = tmp_path / "out"
    cfg, lines = load_config(data=data, overrides=[f"output_dir={out}", "rollout.mode=sync"])
    job = build_job(cfg, lines, in_process=True, log=lambda *a: None, registry=registry)
    try:
        run_job(job, 2, progress=False)
        records = list(job.pipeline.records)
    finally:
        job.close()
        sys.modules.pop("rollart_test_big_envs", None)
    batch = [t for rec in records for t in rec.batch]
    assert batch, "nothing was trained"
    for t in batch:
        assert t.truncated and t.info["truncated_reason"] == "max_context_tokens", t.info
        assert len(t.turns) == 1
        # the trained tokens: the prompt and the model's reply, never the 1 MB answer
        assert sum(len(turn.obs_ids) + len(turn.action_ids) for turn in t.turns) < 256
    (run_dir,) = [p for p in out.iterdir() if p.is_dir() and not p.name.startswith(".")]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 2
    assert summary["launched"] == summary["trained"] + sum(summary["dropped"].values())
