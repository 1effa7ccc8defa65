"""Moved to :mod:`rollart_sdk.backends.master_weights` (the support library for backend
authors); this path re-exports it for one release (CHANGELOG.md)."""

from rollart_sdk.backends.master_weights import (
    LossScaler,
    MasterWeightsOptimizer,
    scale_of,
    scaled,
)

__all__ = ["LossScaler", "MasterWeightsOptimizer", "scale_of", "scaled"]
