"""Registers sink ``wandb``. Imports nothing heavy: wandb loads when a config selects it."""

from __future__ import annotations

from rollart_sdk.hookspecs import hookimpl
from rollart_sdk.registry import Registrar


@hookimpl
def rollart_register_sinks(registry: Registrar) -> None:
    registry.register(
        "wandb",
        factory="rollart_sink_wandb.sink:WandbSink",
        options="rollart_sink_wandb.sink:WandbOptions",
        summary="Weights & Biases, offline by default (the run is kept under the run directory; wandb sync uploads it)",
        requires={"wandb": "pip install wandb (or pip install 'rollart-sink-wandb[lib]')"},
    )
