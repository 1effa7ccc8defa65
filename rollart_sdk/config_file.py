"""Moved to :mod:`rollart_sdk.config.files` (the config in one package); this path
re-exports it for one release (CHANGELOG.md)."""

from rollart_sdk.config.files import MAX_NODES, LineMap, parse_yaml, read_config_file

__all__ = ["MAX_NODES", "LineMap", "parse_yaml", "read_config_file"]
