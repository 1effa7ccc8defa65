"""The small two-task run the control-plane tests share (in-process and on Ray)."""

from __future__ import annotations

import copy
from typing import Any

TWO_TASKS: dict[str, Any] = {
    "name": "t",
    "seed": 0,
    "model": {"tiny": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64}},
    "pools": [
        {"name": "H800", "hardware": "H800", "kind": "gpu", "profile": "compute", "count": 4},
        {"name": "H20", "hardware": "H20", "kind": "gpu", "profile": "bandwidth", "count": 4},
        {"name": "cpu", "hardware": "cpu", "kind": "cpu", "count": 8},
    ],
    "roles": {"actor_gen": {"workers": 2}},
    "tasks": [
        {
            "tag": "FrozenLake",
            "env": {"name": "frozenlake", "options": {"desc": ["SFF", "FHF", "FFG"], "obs_format": "compact"}},
            "reward": {"name": "rule", "options": {"mode": "success"}},
            "affinity": "H800",
            "max_turns": 4,
            "constrain_actions": True,
            "system_prompt": None,
        },
        {
            "tag": "Arithmetic",
            "env": {"name": "arithmetic", "options": {"num_digits": 1, "ops": ["+"]}},
            "reward": {"name": "rule", "options": {"mode": "exact_match"}},
            "affinity": "H20",
            "max_turns": 1,
            "system_prompt": None,
            "sampling": {"max_new_tokens": 4},
        },
    ],
    "engine": {"name": "torch", "options": {"max_running": 32}},
    "trainer": {"name": "torch", "options": {"lr": 0.003, "micro_batch_size": 16}},
    "transport": {"name": "local"},
    "rollout": {"batch_size": 8, "group_size": 4, "mode": "async", "alpha": 1},
    "train": {"steps": 4, "bucket_mb": 1},
}


def two_tasks(**changes: Any) -> dict[str, Any]:
    """A deep copy of TWO_TASKS with top-level keys replaced."""
    data = copy.deepcopy(TWO_TASKS)
    data.update(copy.deepcopy(changes))
    return data
