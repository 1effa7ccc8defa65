"""pytest plugin shipped with rollart-sdk (entry point ``pytest11: rollart``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest


@pytest.fixture
def rollart_plugins() -> Iterator[Any]:
    """An isolated plugin set: built-ins only, no entry points (autoload off)."""
    from rollart_sdk.plugins import load_plugins

    yield load_plugins(autoload=False, strict=False)


@pytest.fixture
def register_plugin() -> Callable[..., Any]:
    """``register_plugin(obj_or_hooks, name=...)`` -> an isolated plugin set with that plugin.

    ``obj_or_hooks`` is a module/object carrying ``@hookimpl`` functions, or a dict of
    hook name -> function (each gets wrapped with ``hookimpl``).
    """
    from rollart_sdk.hookspecs import hookimpl
    from rollart_sdk.plugins import load_plugins

    def make(obj: Any, name: str = "test-plugin", autoload: bool = False) -> Any:
        if isinstance(obj, dict):
            ns = SimpleNamespace(**{k: hookimpl(v) for k, v in obj.items()})
            obj = ns
        assert isinstance(obj, (ModuleType, SimpleNamespace)) or obj is not None
        return load_plugins(autoload=autoload, extra={name: obj}, strict=False)

    return make
