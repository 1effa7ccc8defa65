"""Workloads of the paper's experiments, as run configs (plain dicts) for the simulation.

Each builder returns the ``data`` of a :class:`~rollart_sdk.config.RunConfig`: the sim
backends, pools of the paper's hardware classes, and tasks whose ``sim`` env options
describe the paper's task families (docs/simulation.md says where each number comes from):

- ``frozenlake``: multi-turn, a growing context, short actions (prefill-heavy);
- ``math``: one turn, long chains of thought with a long tail (decode-heavy; the paper's
  production trace: the longest response is about 9x the mean).
"""

from __future__ import annotations

import copy
from typing import Any


def dist(kind: str = "const", **kw: float) -> dict[str, Any]:
    return {"kind": kind, **kw}


def frozenlake(step_mu: float = 2.0, step_sigma: float = 1.0, turns: int = 10,
               response: dict[str, Any] | None = None, affinity: str | None = None,
               weight: float = 1.0) -> dict[str, Any]:
    return {
        "tag": "FrozenLake",
        "env": {"name": "sim", "options": {
            "turns": dist(mean=turns),
            "reset_s": dist(mean=2.0),
            "step_s": dist("normal", mean=step_mu, std=step_sigma),
            "first_obs_tokens": dist(mean=1024),
            "obs_tokens": dist(mean=256),
            "response_tokens": response or dist("lognormal", mean=200, std=100, max=2048),
        }},
        "reward": {"name": "sim"},
        "affinity": affinity,
        "weight": weight,
        "max_turns": turns,
        "max_context_tokens": 32768,
        "sampling": {"max_new_tokens": 2048},
        "step_timeout_s": 600.0,  # a slow step is slow, not hung (the R2 figure)
        "env_pool": 0,
    }


def math(affinity: str | None = None, weight: float = 1.0,
         env_s: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "tag": "Math",
        "env": {"name": "sim", "options": {
            "turns": dist(mean=1),
            "reset_s": dist(mean=0.5),
            "step_s": env_s or dist(mean=0.5),
            "first_obs_tokens": dist(mean=512),
            "response_tokens": dist("lognormal", mean=3000, std=3000, max=27000),
        }},
        "reward": {"name": "sim"},
        "affinity": affinity,
        "weight": weight,
        "max_turns": 1,
        "max_context_tokens": 32768,
        "sampling": {"max_new_tokens": 28000},
        "step_timeout_s": 600.0,
        "env_pool": 0,
    }


def base(tasks: list[dict[str, Any]], gen: dict[str, tuple[int, int]], train_gpus: int = 32,
         batch: int = 128, group: int = 8, mode: str = "async", alpha: int = 1,
         interaction: str = "trajectory", model: str = "qwen3-8b", seed: int = 0,
         transport: dict[str, Any] | None = None, redundancy: float = 0.0,
         engine: dict[str, Any] | None = None, steps: int = 10) -> dict[str, Any]:
    """``gen``: hardware class -> (engines, devices per engine), e.g. ``{"H800": (8, 2),
    "H20": (8, 3)}`` (the planner spreads engines evenly over the generation pools, so
    every class gets the same number of engines); training takes ``train_gpus`` H800
    (8 per data-parallel rank)."""
    if len({n for n, _ in gen.values()}) != 1:
        raise ValueError("give every generation pool the same number of engines; vary "
                         "the devices per engine instead")
    pools = {"H800": train_gpus}
    for hw, (n, dev) in gen.items():
        pools[hw] = pools.get(hw, 0) + n * dev
    gen_pools = list(gen)
    engine = {"devices_by_hardware": {hw: dev for hw, (_, dev) in gen.items()}, **(engine or {})}
    return copy.deepcopy({
        "name": "sim",
        "seed": seed,
        "model": {"path": f"sim:{model}"},
        "clock": "simulated",
        "sim": {"model": model},
        "pools": [{"name": hw, "hardware": hw, "kind": "gpu", "count": n}
                  for hw, n in pools.items()] + [
                 {"name": "cpu", "hardware": "cpu", "kind": "cpu", "count": 64}],
        "roles": {"actor_train": {"pool": "H800", "workers": max(1, train_gpus // 8)},
                  "actor_gen": {"pool": gen_pools[0], "workers": sum(n for n, _ in gen.values())},
                  "environment": {"pool": "cpu", "workers": 4}},
        "tasks": tasks,
        "engine": {"name": "sim", "options": engine},
        "trainer": {"name": "sim", "options": {"devices": 8}},
        "transport": {"name": "sim", "options": transport or {}},
        "rollout": {"batch_size": batch, "group_size": group, "mode": mode, "alpha": alpha,
                    "interaction": interaction, "redundancy": redundancy,
                    # the paper's Sync / Sync+ launch after the update
                    "reset_ahead": False, "stall_timeout_s": 1e6},
        "train": {"steps": steps},
    })

