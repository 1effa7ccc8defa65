"""What each role's worker exposes to the control plane: the boundary between the planes.

One Protocol per role, its methods those the control plane calls (through a
:class:`~rollart_sdk.cluster.handles.WorkerHandle`, by the typed clients of
:mod:`rollart_sdk.cluster.handles`), with their argument and result types:

- :class:`EngineHost`: ``cluster.roles.EngineWorker`` (inference + the weights' receiving side);
- :class:`TrainerHost`: ``cluster.roles.TrainerWorker`` (one data-parallel rank + the sender);
- :class:`EnvHost`: the env hosts of :mod:`rollart_sdk.cluster.envs` (process, inline,
  thread) and the simulator's;
- :class:`RewardHost`: ``cluster.roles.RewardBackendWorker`` and ``RewardRouter``.

A worker's methods may be plain or ``async def`` (a handle awaits both): the trainer's and
env hosts' Protocols say so with :data:`MaybeAwaitable`. Each implementation states its
Protocol under ``TYPE_CHECKING`` (``_conforms: type[EnvHost] = EnvWorker``), so mypy
checks both sides of the boundary: a method renamed or re-typed on a worker fails there.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from typing import Any, Protocol, TypeAlias, TypeVar, Union

from rollart_sdk.cluster.shards import Shard
from rollart_sdk.types import (
    GenerationRequest,
    GenerationResult,
    RewardRequest,
    RewardResult,
    WeightManifest,
    WeightUpdateReport,
)

T = TypeVar("T")
# A plain result or one to await: a worker method may be either (the handle awaits both).
MaybeAwaitable: TypeAlias = Union[T, Awaitable[T]]

# An env step's answer: (observation, reward, terminated, truncated, info).
StepResult = tuple[str, float, bool, bool, dict[str, Any]]
ResetResult = tuple[str, dict[str, Any]]
# What ``generate_many`` yields: the requests that finished together, as (their index in
# the call's list, the result or the exception that request's ``generate`` raised).
GeneratedBatch = list[tuple[int, Union[GenerationResult, BaseException]]]


class EngineHost(Protocol):
    """An inference engine's worker: generation, aborts, and receiving weights."""

    async def generate(self, request: GenerationRequest,
                       kv: list[Any] | None = None) -> GenerationResult: ...

    def generate_many(self, requests: list[GenerationRequest]) -> AsyncIterator[GeneratedBatch]:
        """``generate`` of each request in one call; yields the ones done at the same time
        together, as they finish (the LLMProxy sends a loop iteration's turns this way)."""
        ...

    async def prefill_kv(self, request: GenerationRequest, held: int = 0,
                         held_version: int | None = None,
                         kv: list[Any] | None = None) -> Any: ...

    async def export_kv(self, trajectory_id: str, start: int) -> Any: ...

    async def release(self, trajectory_id: str) -> bool: ...

    async def release_many(self, trajectory_ids: list[str]) -> int: ...

    async def abort(self, request_id: str) -> bool: ...

    async def suspend(self) -> None: ...

    async def resume(self) -> None: ...

    async def stage_weights(self, manifest: WeightManifest) -> None: ...

    async def commit_weights(self) -> WeightUpdateReport: ...

    async def reload(self, manifest: WeightManifest | None,
                     staged: WeightManifest | None = None) -> int: ...

    async def weights_status(self) -> dict[str, Any]: ...

    async def await_weights(self, timeout_s: float | None = None) -> dict[str, Any]: ...

    async def cancel_weights(self) -> None: ...

    async def version(self) -> int: ...

    async def restart_state(self) -> dict[str, Any]: ...

    async def stats(self) -> dict[str, Any]: ...

    async def shutdown(self) -> None: ...


class TrainerHost(Protocol):
    """One trainer rank's worker: optimiser steps, publishing weights, checkpoints."""

    def train_step(self, batch: Shard) -> MaybeAwaitable[dict[str, float]]: ...

    def can_accumulate(self) -> MaybeAwaitable[bool]: ...

    def accumulate(self, batch: Shard) -> MaybeAwaitable[None]: ...

    def publish_weights(self, bucket_bytes: int) -> MaybeAwaitable[WeightManifest | None]: ...

    def release_weights(self, version: int) -> MaybeAwaitable[None]: ...

    def version(self) -> MaybeAwaitable[int]: ...

    def save_checkpoint(self, path: str) -> MaybeAwaitable[None]: ...

    def load_checkpoint(self, path: str) -> MaybeAwaitable[None]: ...

    def save_pretrained(self, path: str) -> MaybeAwaitable[None]: ...


class EnvHost(Protocol):
    """Many envs of any tasks, each addressed by ``env_id`` (built at its first reset).

    ``reset``/``step`` raise the errors of :mod:`rollart_sdk.cluster.envs.errors`
    (``EnvHung`` past ``timeout_s``, ``EnvCallError`` with the env's own error); ``close``
    never raises for the env's error: it returns its text (None: closed cleanly)."""

    def reset(self, env_id: str, tag: str, seed: int,
              timeout_s: float = 30.0) -> MaybeAwaitable[ResetResult]: ...

    def step(self, env_id: str, action: str,
             timeout_s: float = 30.0) -> MaybeAwaitable[StepResult]: ...

    def close(self, env_id: str) -> MaybeAwaitable[str | None]: ...

    def stats(self) -> MaybeAwaitable[dict[str, Any]]: ...

    def shutdown(self) -> MaybeAwaitable[None]: ...


class RewardHost(Protocol):
    """Every task's reward backend: one score per finished trajectory."""

    async def score(self, tag: str, request: RewardRequest) -> RewardResult: ...
