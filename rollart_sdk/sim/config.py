"""Moved to :mod:`rollart_sdk.config.sim` (the config schema no longer imports the
simulator); this name is re-exported for one release (CHANGELOG.md)."""

from rollart_sdk.config.sim import SimConfig

__all__ = ["SimConfig"]
