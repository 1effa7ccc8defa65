"""Moved to :mod:`rollart_sdk.cluster.envs.faults` (fault injection wraps an env in its
host); this path re-exports it for one release (CHANGELOG.md)."""

from rollart_sdk.cluster.envs.faults import FaultyEnv, InjectedFault

__all__ = ["FaultyEnv", "InjectedFault"]
