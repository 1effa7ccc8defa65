"""Moved to :mod:`rollart_sdk.backends.schedules`; this path re-exports it for one release
(CHANGELOG.md)."""

from rollart_sdk.backends.schedules import SCHEDULES, LRScheduleOptions, lr_factor

__all__ = ["SCHEDULES", "LRScheduleOptions", "lr_factor"]
