"""Registers sink ``mlflow``. Imports nothing heavy: mlflow loads when a config selects it."""

from __future__ import annotations

from rollart_sdk.hookspecs import hookimpl
from rollart_sdk.registry import Registrar


@hookimpl
def rollart_register_sinks(registry: Registrar) -> None:
    registry.register(
        "mlflow",
        factory="rollart_sink_mlflow.sink:MlflowSink",
        options="rollart_sink_mlflow.sink:MlflowOptions",
        summary="MLflow tracking (a local file store under the run directory by default)",
        requires={"mlflow": "pip install mlflow-skinny (or pip install 'rollart-sink-mlflow[lib]')"},
    )
