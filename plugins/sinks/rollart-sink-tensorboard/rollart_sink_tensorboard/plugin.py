"""Registers sink ``tensorboard``. Imports nothing heavy: tensorboard loads when a config selects it."""

from __future__ import annotations

from rollart_sdk.hookspecs import hookimpl
from rollart_sdk.registry import Registrar


@hookimpl
def rollart_register_sinks(registry: Registrar) -> None:
    registry.register(
        "tensorboard",
        factory="rollart_sink_tensorboard.sink:TensorBoardSink",
        options="rollart_sink_tensorboard.sink:TensorBoardOptions",
        summary="TensorBoard event files under the run directory (scalars, config and samples as text)",
        requires={"tensorboard": "pip install tensorboard (or pip install 'rollart-sink-tensorboard[lib]')"},
    )
