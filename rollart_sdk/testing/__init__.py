"""Conformance kits and pytest helpers for plugin authors.

- ``check_env(env)`` / ``check_reward(backend, cases)``: environments and reward backends;
- ``check_engine`` / ``check_trainer`` / ``check_transport``: engines, trainers, transports
  (``LoadingThrough``: an engine kit whose updates go through a transport;
  ``DirectRecordingEngine``: a transport kit on the collective path);
- the pytest plugin (auto-loaded): fixtures ``rollart_plugins`` (an isolated plugin set,
  entry points not loaded) and ``register_plugin`` (add a plugin for one test).

The kits are imported lazily (``from rollart_sdk.testing import check_env`` works) so that
loading the pytest plugin never imports torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_KITS = {
    "check_env": "env",
    "check_reward": "reward",
    "make_request": "reward",
    "check_engine": "engine",
    "check_engine_async": "engine",
    "check_trainer": "trainer",
    "check_transport": "transport",
    "DirectRecordingEngine": "transport",
    "LoadingThrough": "transport",
}

__all__ = list(_KITS)


def __getattr__(name: str) -> Any:
    if name in _KITS:
        return getattr(importlib.import_module(f"rollart_sdk.testing.{_KITS[name]}"), name)
    raise AttributeError(f"module 'rollart_sdk.testing' has no attribute {name!r}")
