"""The env host of a run on virtual time (``rollart sim``, ``clock: simulated``).

Envs that model their own latency (env ``sim``: each ``reset``/``step`` returns at once
and sets ``last_latency_s``, the seconds the call would have taken) are built and called
in the control plane's process, as inline envs are; the host then sleeps that latency on
the event loop's clock (:class:`rollart_sdk.sim.clock.VirtualTimeLoop`), so a call takes
its modelled time in virtual seconds. A call modelled slower than its ``timeout_s`` fails
as :class:`~rollart_sdk.cluster.envs.errors.EnvHung` after the timeout, its env dropped
(as the process host kills a hung env's process); an env's own error is an
:class:`~rollart_sdk.cluster.envs.errors.EnvCallError` after the call's latency.

An env that has an ``instance_key`` attribute is given its env id there before its first
reset (env ``sim`` keys its draws by it, so the same launch replays the same episode).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from rollart_sdk.cluster.envs.errors import EnvCallError, EnvHung, error_text
from rollart_sdk.cluster.envs.results import plain_info, text_observation
from rollart_sdk.cluster.worker import EnvironmentWorker

if TYPE_CHECKING:
    from rollart_sdk.cluster.hosts import EnvHost, ResetResult, StepResult


class VirtualEnvHost(EnvironmentWorker):
    """Hosts envs by id on virtual time (see the module docstring). ``envs``: tag ->
    (descriptor, options)."""

    def __init__(self, envs: dict[str, tuple[Any, ...]]) -> None:
        self.name = self.worker_name
        self._specs = envs
        self._envs: dict[str, Any] = {}
        self.constructions: dict[str, int] = {}
        self.killed = 0
        self.failures = 0

    async def _wait(self, env_id: str, env: Any, call: str, timeout_s: float) -> None:
        """Sleep the call's modelled latency; past ``timeout_s``, the env is dropped."""
        latency = float(getattr(env, "last_latency_s", 0.0))
        if latency > timeout_s:
            await asyncio.sleep(timeout_s)
            self._envs.pop(env_id, None)
            self.killed += 1
            raise EnvHung(f"EnvHung: {call} took longer than {timeout_s}s")
        if latency > 0:
            await asyncio.sleep(latency)

    def _build(self, env_id: str, tag: str) -> Any:
        if tag not in self._specs:
            raise KeyError(f"task {tag!r} has no env on {self.name} (tasks: "
                           f"{', '.join(sorted(self._specs))})")
        desc, opts = self._specs[tag][0], self._specs[tag][1]
        try:
            env = desc.create(opts)
        except Exception as exc:
            raise EnvCallError(f"constructing the env raised {error_text(exc)}") from exc
        if hasattr(env, "instance_key"):
            env.instance_key = env_id
        self._envs[env_id] = env
        self.constructions[tag] = self.constructions.get(tag, 0) + 1
        return env

    async def _call(self, env_id: str, env: Any, call: str, timeout_s: float,
                    *args: Any, **kwargs: Any) -> Any:
        """The env's answer in the shape every host returns, after the call's latency."""
        try:
            out = getattr(env, call)(*args, **kwargs)
            if call == "reset":
                out = (text_observation(out[0], call), plain_info(out[1]))
            else:
                obs, reward, term, trunc, info = out
                out = (text_observation(obs, call), float(reward), bool(term), bool(trunc),
                       plain_info(info))
        except Exception as exc:
            self.failures += 1
            await self._wait(env_id, env, call, timeout_s)
            raise EnvCallError(error_text(exc)) from exc
        await self._wait(env_id, env, call, timeout_s)
        return out

    async def reset(self, env_id: str, tag: str, seed: int,
                    timeout_s: float = 30.0) -> ResetResult:
        env = self._envs.get(env_id) or self._build(env_id, tag)
        out: ResetResult = await self._call(env_id, env, "reset", timeout_s, seed=seed)
        return out

    async def step(self, env_id: str, action: str, timeout_s: float = 30.0) -> StepResult:
        env = self._envs.get(env_id)
        if env is None:
            raise KeyError(f"no env {env_id!r} on {self.name} (never reset, or killed)")
        out: StepResult = await self._call(env_id, env, "step", timeout_s, action)
        return out

    async def close(self, env_id: str) -> str | None:
        self._envs.pop(env_id, None)
        return None

    async def count(self) -> int:
        return len(self._envs)

    async def stats(self) -> dict[str, Any]:
        return {"name": self.name, "live": len(self._envs),
                "constructions": dict(self.constructions), "killed": self.killed,
                "failures": self.failures, "closed": 0}

    async def shutdown(self) -> None:
        self._envs.clear()


if TYPE_CHECKING:  # mypy checks the host against the env role's Protocol
    _conforms: type[EnvHost] = VirtualEnvHost
