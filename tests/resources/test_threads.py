"""The thread plan: roles share the cores without oversubscription."""

from __future__ import annotations

import copy

from rollart_sdk.config import load_config
from rollart_sdk.resources.threads import thread_plan

BASE = {
    "name": "t",
    "model": {"tiny": {"hidden_size": 32, "num_layers": 1, "num_heads": 2,
                       "intermediate_size": 64}},
    "tasks": [{"tag": "F", "env": {"name": "frozenlake"}}],
}


def _cfg(mode="sync", gen=None, ranks=1, num_cpus=None):
    data = copy.deepcopy(BASE)
    data["rollout"] = {"mode": mode}
    data["roles"] = {"actor_gen": gen or {"workers": 1}, "actor_train": {"workers": ranks}}
    if num_cpus:
        data["ray"] = {"num_cpus": num_cpus}
    return load_config(data=data)[0]


def _busy_at_once(plan, cfg, engines):
    """Torch threads that run at the same time, plus one core of control-plane Python."""
    ranks = cfg.roles.actor_train.workers
    if cfg.rollout.mode == "sync":  # rollout and training alternate
        return max(engines * plan["actor_gen"] + 1, ranks * plan["actor_train"])
    return engines * plan["actor_gen"] + ranks * plan["actor_train"] + 1


def test_sync_alternates_async_splits(monkeypatch):
    monkeypatch.delenv("ROLLART_TORCH_THREADS", raising=False)
    sync = thread_plan(_cfg("sync"), cores=8)
    assert sync["actor_gen"] == 7 and sync["actor_train"] == 8  # each phase has the machine
    asyn = thread_plan(_cfg("async"), cores=8)
    assert asyn["actor_gen"] == 3 and asyn["actor_train"] == 3  # 7 cores for two at once
    assert sync["environment"] == sync["reward"] == 1


def test_never_oversubscribed_when_cores_allow(monkeypatch):
    monkeypatch.delenv("ROLLART_TORCH_THREADS", raising=False)
    for mode in ("sync", "async"):
        for cores in (2, 4, 8, 16):
            for gen, engines in (({"workers": 2}, 2),
                                 ({"prefill": {"workers": 1}, "decode": {"workers": 2}}, 3)):
                for ranks in (1, 2):
                    cfg = _cfg(mode, gen, ranks)
                    plan = thread_plan(cfg, cores=cores)
                    assert min(plan["actor_gen"], plan["actor_train"]) >= 1
                    if cores - 1 >= engines + ranks:  # room for one thread each
                        assert _busy_at_once(plan, cfg, engines) <= cores, (mode, cores, gen)


def test_two_cores_one_thread_each_and_overrides(monkeypatch):
    monkeypatch.delenv("ROLLART_TORCH_THREADS", raising=False)
    plan = thread_plan(_cfg("async"), cores=2)
    assert plan["actor_gen"] == plan["actor_train"] == 1
    assert thread_plan(_cfg("sync", num_cpus=6))["cores"] == 6  # ray.num_cpus is the budget
    monkeypatch.setenv("ROLLART_TORCH_THREADS", "3")
    plan = thread_plan(_cfg("async"), cores=2)
    assert plan["actor_gen"] == plan["actor_train"] == plan["process"] == 3


def test_an_engines_long_steps_take_every_core_only_while_nothing_else_computes(monkeypatch):
    """``actor_gen_burst``: in sync mode the engines generate while the trainer waits,
    so a long step may use every core (``cores / engines``); in async mode, or with
    groups trained while the rollout goes on, the engines keep their share."""
    monkeypatch.delenv("ROLLART_TORCH_THREADS", raising=False)
    sync = thread_plan(_cfg("sync"), cores=8)
    assert sync["actor_gen"] == 7 and sync["actor_gen_burst"] == 8
    two = thread_plan(_cfg("sync", {"workers": 2}), cores=8)
    assert two["actor_gen"] == 3 and two["actor_gen_burst"] == 4
    asyn = thread_plan(_cfg("async"), cores=8)
    assert asyn["actor_gen_burst"] == asyn["actor_gen"] == 3
    streamed = _cfg("sync")
    streamed.train.stream_groups = True
    assert thread_plan(streamed, cores=8)["actor_gen_burst"] == 7
    monkeypatch.setenv("ROLLART_TORCH_THREADS", "2")
    assert thread_plan(_cfg("sync"), cores=8)["actor_gen_burst"] == 2
