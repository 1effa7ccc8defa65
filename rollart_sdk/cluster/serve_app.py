"""Moved to :mod:`rollart_sdk.serverless.deploy`; this path re-exports it for one release
(CHANGELOG.md)."""

from rollart_sdk.serverless.deploy import (
    POLL_S,
    PROGRESS_S,
    SERVE_CONFIG_LOCK,
    TOKEN_ENV,
    DeployError,
    DeployOptions,
    ReplicaMonitor,
    RewardFunction,
    check_exposure,
    deploy,
    is_loopback,
    replica_count,
    replica_counts,
    replica_states,
    serve_status,
    states_of,
    token_digest,
    wait_running,
)

__all__ = [
    "POLL_S", "PROGRESS_S", "SERVE_CONFIG_LOCK", "TOKEN_ENV", "DeployError", "DeployOptions",
    "ReplicaMonitor", "RewardFunction", "check_exposure", "deploy", "is_loopback",
    "replica_count", "replica_counts", "replica_states", "serve_status", "states_of",
    "token_digest", "wait_running",
]
