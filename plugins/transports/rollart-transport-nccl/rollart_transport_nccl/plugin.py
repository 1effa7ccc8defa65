"""Registers the "nccl" weight transport. Imports nothing heavy (no torch)."""

from __future__ import annotations

from rollart_sdk.hookspecs import hookimpl
from rollart_sdk.registry import Registrar


@hookimpl
def rollart_register_transports(registry: Registrar) -> None:
    registry.register(
        "nccl",
        factory="rollart_transport_nccl.transport:NcclTransport",
        options="rollart_transport_nccl.transport:NcclTransportOptions",
        summary="broadcast each version from trainer rank 0 to every engine worker in a "
        "dedicated process group (nccl on GPUs, gloo on CPU)",
    )
