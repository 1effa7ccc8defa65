"""tasks[].env_host: cheap envs inline in the EnvManagers' process, the rest on env workers."""

from __future__ import annotations

import copy
import os

import pytest
from control_configs import TWO_TASKS

from rollart_sdk.cluster.inline_env import (
    InlineEnvCallError,
    InlineEnvWorker,
    inline_tasks,
    thread_tasks,
)
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
        assert isinstance(frozen.target, InlineEnvWorker)
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
    assert frozen.target.count() == 0  # every pooled env closed at run end
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
    with pytest.raises(InlineEnvCallError, match="ValueError: bad seed 3"):
        w.reset("e1", "T", 3)
    with pytest.raises(KeyError, match="no env 'e2'"):
        w.step("e2", "x")
    with pytest.raises(KeyError, match="no inline env"):
        w.reset("e3", "Other", 0)
    assert w.close("e1") == "env close raised OSError: close failed"
    assert w.close("e1") is None and w.count() == 0


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
