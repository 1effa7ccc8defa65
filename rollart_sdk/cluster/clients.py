"""Moved to :mod:`rollart_sdk.cluster.handles` (the worker handle and its typed clients are
one module); this path re-exports the names for one release (CHANGELOG.md)."""

from rollart_sdk.cluster.handles import (
    EngineClient,
    EnvClient,
    RewardClient,
    TrainerClient,
    await_answer,
)

__all__ = ["EngineClient", "EnvClient", "RewardClient", "TrainerClient", "await_answer"]
