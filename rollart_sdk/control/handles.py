"""Moved to :mod:`rollart_sdk.cluster.handles` (the cluster builds handles, the control
plane calls them); this path re-exports it for one release (CHANGELOG.md)."""

from rollart_sdk.cluster.handles import WorkerHandle

__all__ = ["WorkerHandle"]
