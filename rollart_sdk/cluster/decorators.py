"""Moved to :mod:`rollart_sdk.resources.decorators` (the resource plan checks them against
the pools, below the cluster); this path re-exports it for one release (CHANGELOG.md)."""

from rollart_sdk.resources.decorators import (
    ATTR,
    DispatchSpec,
    Mode,
    check_worker_class,
    dispatch_specs,
    dp_shards,
    hw_mapping,
    register,
    register_serverless,
)

__all__ = ["ATTR", "DispatchSpec", "Mode", "check_worker_class", "dispatch_specs", "dp_shards",
           "hw_mapping", "register", "register_serverless"]
