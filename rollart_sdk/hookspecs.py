"""Hook specifications of the ``rollart`` plugin system.

Every hook receives a :class:`rollart_sdk.registry.Registrar` bound to one plugin kind.
An implementation registers names, never heavy objects::

    from rollart_sdk import hookimpl

    @hookimpl
    def rollart_register_envs(registry):
        registry.register(
            "frozenlake",
            factory="rollart_env_frozenlake.env:FrozenLakeTextEnv",
            options="rollart_env_frozenlake.env:FrozenLakeOptions",
            summary="FrozenLake with text observations and text actions",
        )

``factory`` and ``options`` are imported only when a config selects the name.
Implementations may omit the ``registry`` argument (pluggy allows fewer arguments).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import pluggy

if TYPE_CHECKING:
    from rollart_sdk.registry import Registrar

PROJECT = "rollart"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

F = TypeVar("F", bound=Callable[..., None])
# kind -> hook name, filled by @_kind below: the single source of truth for the kinds
# (``interfaces.KINDS`` and the registry read it).
KIND_HOOKS: dict[str, str] = {}


def _kind(kind: str) -> Callable[[F], F]:
    """Declare a registration hook for one plugin kind."""

    def mark(fn: F) -> F:
        KIND_HOOKS[kind] = fn.__name__
        return hookspec(fn)

    return mark


@_kind("env")
def rollart_register_envs(registry: Registrar) -> None:
    """Register environments: gymnasium envs with text observations and text actions.

    The factory is called as ``factory(**options)`` and must return an object following
    :class:`rollart_sdk.interfaces.TextEnv`. Registering an env also registers it with
    ``gymnasium.register`` as ``rollart/<name>`` so ``gymnasium.make`` finds it.
    """


@_kind("engine")
def rollart_register_engines(registry: Registrar) -> None:
    """Register inference engines (:class:`rollart_sdk.interfaces.InferenceEngine`).

    The factory is called as ``factory(model=<ModelConfig>, **options)`` inside an
    ActorGen worker.
    """


@_kind("trainer")
def rollart_register_trainers(registry: Registrar) -> None:
    """Register training backends (:class:`rollart_sdk.interfaces.Trainer`).

    The factory is called as ``factory(model=<ModelConfig>, rank=, world_size=,
    init_method=, **options)`` inside each ActorTrain worker.
    """


@_kind("reward")
def rollart_register_rewards(registry: Registrar) -> None:
    """Register reward backends (:class:`rollart_sdk.interfaces.RewardBackend`).

    The factory is called as ``factory(**options)``; ``score`` is awaited once per
    finished trajectory.
    """


@_kind("transport")
def rollart_register_transports(registry: Registrar) -> None:
    """Register weight transports (:class:`rollart_sdk.interfaces.WeightTransport`).

    The factory is called as ``factory(role="sender" | "receiver", **options)``: once
    in the trainer (sender) and once in each engine worker (receiver).
    """


@_kind("placement")
def rollart_register_placements(registry: Registrar) -> None:
    """Register placement policies (:class:`rollart_sdk.interfaces.PlacementPolicy`).

    The factory is called as ``factory(**options)`` by the ResourceManager; the policy
    picks a pool for each worker and says why.
    """


@_kind("benchmark")
def rollart_register_benchmarks(registry: Registrar) -> None:
    """Register benchmarks run by ``rollart bench NAME [ARGS]``.

    The factory is called as ``factory(argv: list[str]) -> int`` with the arguments after
    the name (``--help`` included: each benchmark owns its parser); it prints a table and
    returns the exit status.
    """


@_kind("sink")
def rollart_register_sinks(registry: Registrar) -> None:
    """Register metric sinks (:class:`rollart_sdk.interfaces.MetricSink`), selected by
    ``logging: [{name: ..., options: {...}}]``.

    The factory is called as ``factory(run_dir: str, run_name: str, **options)`` in the
    driver process when the run starts; the sink then receives the run config once and
    every step's metrics (and, if it has ``log_samples``, the step's samples). A sink that
    raises is warned about once and counted; the run goes on.
    """


@_kind("serverless_scheme")
def rollart_register_serverless_schemes(registry: Registrar) -> None:
    """Register callers for serverless endpoint URL schemes (``myscheme://...``).

    The factory is called as ``factory(url: str, timeout_s: float)`` wherever a serverless
    endpoint is used (``@register_serverless``, serverless pools, the serverless reward)
    and returns a callable: ``caller(*args, **kwargs)`` invokes the remote function and
    returns its result, raising ``rollart_sdk.serverless.ServerlessError``.
    """
