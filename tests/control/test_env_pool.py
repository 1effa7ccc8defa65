"""Pooled environments: built once, reused episode after episode, replaced when they fail."""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace

import pytest
from control_configs import TWO_TASKS

from rollart_sdk.config import load_config
from rollart_sdk.control.env_pool import ENV_FAILURES, EnvPool
from rollart_sdk.control.handles import WorkerHandle
from rollart_sdk.errors import ConfigError
from rollart_sdk.job import build_job, run_job
from rollart_sdk.plugins import load_plugins

ENVS = """
import itertools
import os
import time
import gymnasium as gym
from pydantic import BaseModel, ConfigDict

BUILT = itertools.count()


class Options(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CountedEnv(gym.Env):
    '''Two turns; remembers how many episodes this very instance played.'''

    action_vocabulary = None
    system_prompt = None

    def __init__(self):
        # Each env runs in its own process: the pid tells instances apart.
        self.instance = f"{os.getpid()}-{next(BUILT)}"
        self.episodes = 0

    def reset(self, *, seed=None, options=None):
        self.episodes += 1
        self.t = 0
        return "go", {"instance": self.instance, "episode_of_instance": self.episodes}

    def step(self, action):
        self.t += 1
        done = self.t >= 2
        return "go on", float(done), done, False, {"instance": self.instance,
                                                   "episode_of_instance": self.episodes}


class BreakingEnv(CountedEnv):
    '''Its third episode fails at reset (a container that died); later ones never run.'''

    def reset(self, *, seed=None, options=None):
        if self.episodes == 2:
            self.episodes += 1
            raise RuntimeError("container died")
        if self.episodes > 2:
            raise AssertionError("a failed instance was reused")
        return super().reset(seed=seed, options=options)
"""


@pytest.fixture
def pool_envs(tmp_path, monkeypatch):
    import sys

    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "rollart_pool_envs.py").write_text(ENVS)
    monkeypatch.syspath_prepend(str(mods))
    from rollart_sdk import hookimpl

    def rollart_register_envs(registry):
        for name, cls in (("counted", "CountedEnv"), ("breaking", "BreakingEnv")):
            registry.register(name, factory=f"rollart_pool_envs:{cls}",
                              options="rollart_pool_envs:Options")

    yield load_plugins(strict=True, extra={"pool-envs": SimpleNamespace(
        rollart_register_envs=hookimpl(rollart_register_envs))}).registry
    sys.modules.pop("rollart_pool_envs", None)


def run(tmp_path, registry, env: str, env_pool, steps: int, mode: str = "async"):
    data = copy.deepcopy(TWO_TASKS)
    data["tasks"] = [{"tag": "T", "env": {"name": env}, "max_turns": 2, "system_prompt": None,
                      "reward": {"name": "rule", "options": {"mode": "env_return"}},
                      "sampling": {"max_new_tokens": 2}, "env_pool": env_pool}]
    cfg, lines = load_config(data=data, overrides=[f"output_dir={tmp_path}",
                                                   f"rollout.mode={mode}"])
    job = build_job(cfg, lines, in_process=True, log=lambda *a: None, registry=registry)
    try:
        records = run_job(job, steps, progress=False)
    finally:
        job.close()
    return job, records


def env_workers(job):
    return [h.target for h in job.pipeline.scheduler.env_workers]


def test_one_construction_per_pooled_env_across_many_episodes(tmp_path, pool_envs):
    job, records = run(tmp_path, pool_envs, "counted", env_pool=4, steps=6, mode="sync")
    pool = job.pipeline.scheduler.pools["T"]
    episodes = sum(s.episodes for s in pool.slots)
    built = sum(w.stats()["constructions"].get("T", 0) for w in env_workers(job))
    assert episodes >= 6 * 8  # 8 trajectories a step, every one an episode of a pooled env
    assert built == 4, f"{built} envs built for {episodes} episodes with a pool of 4"
    # The trained trajectories came from 4 instances (build_job built one more in this
    # process to read the env's facts), each playing many episodes in turn.
    trained = [t.info for r in records for t in r.batch]
    assert len({i["instance"] for i in trained}) == 4
    assert max(i["episode_of_instance"] for i in trained) >= 10
    # Each slot's EnvManager is made once and lives across its episodes too.
    assert all(s.manager is not None and s.manager.episodes == s.episodes for s in pool.slots)
    # Closed at the end of the run.
    assert all(w.stats()["live"] == 0 for w in env_workers(job))
    summary = json.loads((job.run_dir.path / "summary.json").read_text())
    assert summary["envs"]["constructions"] == {"T": 4}
    assert summary["envs"]["pools"]["T"]["episodes"] == episodes
    metrics = [json.loads(x) for x in (job.run_dir.path / "metrics.jsonl").read_text().splitlines()]
    assert all(m["env/reset_s/T"] >= 0 and m["env/failures"] == 0 for m in metrics)


def test_a_failed_env_is_closed_and_replaced(tmp_path, pool_envs):
    job, records = run(tmp_path, pool_envs, "breaking", env_pool=4, steps=3)
    pool = job.pipeline.scheduler.pools["T"]
    dropped = job.pipeline.buffer.dropped
    # Every env failure the pool replaced is a counted drop. Under load a reset can also
    # time out (env_reset_timeout), so compare with all env-failure reasons together.
    env_drops = sum(dropped.get(reason, 0) for reason in ENV_FAILURES)
    assert env_drops == pool.failures and dropped["env_reset_failed"] > 0, dict(dropped)
    built = sum(w.stats()["constructions"].get("T", 0) for w in env_workers(job))
    # Every failure cost one new instance (the BreakingEnv asserts a broken one is never
    # reset again); nothing else was rebuilt.
    assert 4 < built <= 4 + pool.failures
    assert len(records) == 3 and all(t.reward == 1.0 for r in records for t in r.batch)
    metrics = [json.loads(x) for x in (job.run_dir.path / "metrics.jsonl").read_text().splitlines()]
    # written at the last step's end; async rollouts may fail once more before the run stops
    assert 0 < metrics[-1]["env/failures"] <= pool.failures


def test_env_pool_zero_keeps_one_env_per_trajectory(tmp_path, pool_envs):
    job, records = run(tmp_path, pool_envs, "counted", env_pool=0, steps=2, mode="sync")
    built = sum(w.stats()["constructions"].get("T", 0) for w in env_workers(job))
    assert job.pipeline.scheduler.pools == {}
    assert built == job.pipeline.scheduler.launched >= 16


def test_pool_smaller_than_a_group_is_a_config_error(tmp_path, pool_envs):
    with pytest.raises(ConfigError, match="tasks.0.env_pool.*group of 4"):
        run(tmp_path, pool_envs, "counted", env_pool=2, steps=1)


def test_pool_hands_out_built_slots_first_and_renames_replaced_ones():
    workers = [WorkerHandle(f"env-{i}", object(), is_ray=False) for i in range(2)]
    pool = EnvPool.spread("T", 3, workers)
    assert [s.worker.name for s in pool.slots] == ["env-0", "env-1", "env-0"]
    a, b = pool.acquire(), pool.acquire()
    assert pool.release(b, None, 0.5) is False and b.built  # b is built now
    c = pool.acquire()
    assert c is b  # a built instance before an unbuilt one
    old = c.env_id
    assert pool.release(c, "env_step_timeout: no step within 30s", 0.1) is True
    assert c.env_id != old and not c.built and pool.failures == 1
    assert pool.release(a, "aborted:stale", 0.2) is False and pool.failures == 1
    m = pool.metrics()
    assert m["env/reset_s/T"] == pytest.approx((0.5 + 0.1 + 0.2) / 3)
    assert m["env/failures/T"] == 1 and "env/reset_s/T" not in pool.metrics()
