"""Moved to :mod:`rollart_sdk.backends.engine_adapter`; this path re-exports it for one
release (CHANGELOG.md)."""

from rollart_sdk.backends.engine_adapter import (
    SEED_STRIDE,
    AdapterRequest,
    EngineAdapter,
    checkpoint_shapes,
    convert_buckets,
    eos_ids,
    submission_seed,
)

__all__ = ["SEED_STRIDE", "AdapterRequest", "EngineAdapter", "checkpoint_shapes",
           "convert_buckets", "eos_ids", "submission_seed"]
