"""Registers engine ``sglang``. Imports nothing heavy: SGLang loads when a config selects it."""

from __future__ import annotations

from rollart_sdk.hookspecs import hookimpl
from rollart_sdk.registry import Registrar


@hookimpl
def rollart_register_engines(registry: Registrar) -> None:
    registry.register(
        "sglang",
        factory="rollart_engine_sglang.engine:SglangEngine",
        options="rollart_engine_sglang.options:SglangEngineOptions",
        summary="SGLang Engine 0.5.23 (GPU; CPU engine tested with a test-only kit); radix cache, in-place weight updates",
        requires={"sglang": "on a CUDA machine: pip install 'rollart-engine-sglang[gpu]' "
                            "(plugins/engines/rollart-engine-sglang/README.md)"},
    )
