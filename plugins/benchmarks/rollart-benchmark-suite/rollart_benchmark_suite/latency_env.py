"""Env ``bench-frozenlake`` (``rollart bench small``): FrozenLake whose steps sleep.

In a module of its own that imports the frozenlake plugin (and so gymnasium) at import:
with ``env_host: worker`` each env runs in a process forked from a server that has the
env's module imported (``cluster/envs/process.py``), so every env process starts with
them loaded. (The class lived in ``bench/small.py`` and imported them in ``__init__``:
each env process paid gymnasium's import, about 0.15 s of CPU, once per env process;
``rollart bench turns --env-host worker`` showed it.)
"""

from __future__ import annotations

import random
import time
from typing import Any

from rollart_env_frozenlake.env import FrozenLakeTextEnv


class LatencyFrozenLake:
    """FrozenLake (the ``frozenlake`` plugin's env) whose steps sleep N(mu, sigma), truncated
    at 0, drawn from the reset seed and a per-process instance counter, and whose resets
    sleep ``reset_s``. Each step's info carries ``env_sleep_s``, the seconds this episode
    has slept so far, and ``last_sleep_s`` (the bench's latency floors are computed from
    them)."""

    _instances = 0

    def __init__(self, mu: float = 0.0, sigma: float = 0.0, reset_s: float = 0.0,
                 **options: Any) -> None:
        self._env = FrozenLakeTextEnv(**options)
        self.reset_s = reset_s
        self.action_vocabulary = self._env.action_vocabulary
        self.system_prompt = self._env.system_prompt
        self.mu, self.sigma = mu, sigma
        LatencyFrozenLake._instances += 1
        self._index = LatencyFrozenLake._instances
        self._rng = random.Random(0)
        self._slept = 0.0

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[str, dict[str, Any]]:
        self._rng = random.Random(f"{seed}/{self._index}")
        self._slept = 0.0
        if self.reset_s:
            time.sleep(self.reset_s)
        return self._env.reset(seed=seed, options=options)

    def step(self, action: str) -> Any:
        x = 0.0
        if self.mu > 0:
            x = -1.0
            for _ in range(100):
                x = self._rng.gauss(self.mu, self.sigma)
                if x >= 0:
                    break
            x = max(0.0, x)
            time.sleep(x)
        self._slept += x
        obs, reward, terminated, truncated, info = self._env.step(action)
        info = {**info, "env_sleep_s": self._slept, "last_sleep_s": x}
        return obs, reward, terminated, truncated, info

    def close(self) -> None:
        self._env.close()
