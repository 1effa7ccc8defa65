"""Registers engine ``torch``. Imports nothing heavy: the engine loads when selected."""

from __future__ import annotations

from rollart_sdk.hookspecs import hookimpl
from rollart_sdk.registry import Registrar


@hookimpl
def rollart_register_engines(registry: Registrar) -> None:
    registry.register(
        "torch",
        factory="rollart_engine_torch.engine:TorchEngine",
        options="rollart_engine_torch.options:TorchEngineOptions",
        summary="continuous batching over a Hugging Face Llama-family model (CPU/GPU, torch)",
    )


@hookimpl
def rollart_register_benchmarks(registry: Registrar) -> None:
    registry.register(
        "engine",
        factory="rollart_engine_torch.bench:main",
        summary="torch engine vs static generate; --engine vllm: vLLM vs torch vs static",
    )
