"""Fault injection: run any env under injected errors, hangs and latency.

``tasks[].env.faults`` in a run config (or ``tasks.0.env.faults.reset_error=0.2`` on the
command line) wraps every env of that task in :class:`FaultyEnv`::

    faults: {reset_error: 0.2, step_error: 0.1, hang: 0.05, latency: {mu: 0.05, sigma: 0.02}}

Each env draws its faults from its own RNG, seeded from its env id (a trajectory id, so
the members of a group and a member's re-run draw independently), so a run's faults do
not depend on thread timing. Injected errors raise
:class:`InjectedFault`; a hang sleeps ``hang_s`` seconds (the env host kills it at the
task's timeout). docs/failures.md says what each does to a run.
"""

from __future__ import annotations

import random
import time
from typing import Any

from rollart_sdk.config import FaultConfig


class InjectedFault(RuntimeError):
    """An error raised on purpose by :class:`FaultyEnv`."""


class FaultyEnv:
    """Wraps an env (``reset``/``step``/``close``); forwards every other attribute."""

    def __init__(self, env: Any, faults: FaultConfig, seed: int | str = 0) -> None:
        self._env = env
        self._faults = faults
        self._rng = random.Random(str(seed))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)

    def _delay(self) -> None:
        lat = self._faults.latency
        if lat is not None and (lat.mu or lat.sigma):
            time.sleep(max(0.0, self._rng.gauss(lat.mu, lat.sigma)))

    def _maybe(self, error_p: float, what: str) -> None:
        self._delay()
        if self._faults.hang and self._rng.random() < self._faults.hang:
            time.sleep(self._faults.hang_s)
        if error_p and self._rng.random() < error_p:
            raise InjectedFault(f"injected {what} error (tasks[].env.faults)")

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        self._maybe(self._faults.reset_error, "reset")
        return self._env.reset(seed=seed, options=options)

    def step(self, action: Any) -> Any:
        self._maybe(self._faults.step_error, "step")
        return self._env.step(action)

    def close(self) -> None:
        close = getattr(self._env, "close", None)
        if callable(close):
            close()
