"""Moved to :mod:`rollart_sdk.backends.precision` (the support library for backend
authors); this path re-exports it for one release (CHANGELOG.md)."""

from rollart_sdk.backends.precision import LOW_PRECISION, PrecisionOptions

__all__ = ["LOW_PRECISION", "PrecisionOptions"]
