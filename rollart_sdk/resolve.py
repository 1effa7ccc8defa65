"""Moved to :mod:`rollart_sdk.config.resolve` (the config in one package); this path
re-exports it for one release (CHANGELOG.md)."""

from rollart_sdk.config.resolve import Resolved, ResolvedRun, resolve_run

__all__ = ["Resolved", "ResolvedRun", "resolve_run"]
