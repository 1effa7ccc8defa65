"""Moved to :mod:`rollart_sdk.serverless.replica_log`; this path re-exports it for one
release (CHANGELOG.md)."""

from rollart_sdk.serverless.replica_log import ReplicaLog, ReplicaUsage, read_usage

__all__ = ["ReplicaLog", "ReplicaUsage", "read_usage"]
