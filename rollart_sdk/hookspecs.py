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

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from rollart_sdk.registry import Registrar

PROJECT = "rollart"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def rollart_register_envs(registry: Registrar) -> None:
    """Register environments: gymnasium envs with text observations and text actions.

    The factory is called as ``factory(**options)`` and must return an object following
    :class:`rollart_sdk.interfaces.TextEnv`. Registering an env also registers it with
    ``gymnasium.register`` as ``rollart/<name>`` so ``gymnasium.make`` finds it.
    """


@hookspec
def rollart_register_engines(registry: Registrar) -> None:
    """Register inference engines (:class:`rollart_sdk.interfaces.InferenceEngine`).

    The factory is called as ``factory(model=<ModelConfig>, **options)`` inside an
    ActorGen worker.
    """


@hookspec
def rollart_register_trainers(registry: Registrar) -> None:
    """Register training backends (:class:`rollart_sdk.interfaces.Trainer`).

    The factory is called as ``factory(model=<ModelConfig>, rank=, world_size=,
    init_method=, **options)`` inside each ActorTrain worker.
    """


@hookspec
def rollart_register_rewards(registry: Registrar) -> None:
    """Register reward backends (:class:`rollart_sdk.interfaces.RewardBackend`).

    The factory is called as ``factory(**options)``; ``score`` is awaited once per
    finished trajectory.
    """


@hookspec
def rollart_register_transports(registry: Registrar) -> None:
    """Register weight transports (:class:`rollart_sdk.interfaces.WeightTransport`).

    The factory is called as ``factory(role="sender" | "receiver", **options)``: once
    in the trainer (sender) and once in each engine worker (receiver).
    """


@hookspec
def rollart_register_placements(registry: Registrar) -> None:
    """Register placement policies (:class:`rollart_sdk.interfaces.PlacementPolicy`).

    The factory is called as ``factory(**options)`` by the ResourceManager; the policy
    picks a pool for each worker and says why.
    """


# kind -> hook name; the single source of truth for which hooks exist.
KIND_HOOKS: dict[str, str] = {
    "env": "rollart_register_envs",
    "engine": "rollart_register_engines",
    "trainer": "rollart_register_trainers",
    "reward": "rollart_register_rewards",
    "transport": "rollart_register_transports",
    "placement": "rollart_register_placements",
}
