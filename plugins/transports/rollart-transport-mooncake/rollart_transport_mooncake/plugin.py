"""Registers the "mooncake" weight transport. Imports nothing heavy (no mooncake, no torch)."""

from __future__ import annotations

from rollart_sdk.hookspecs import hookimpl
from rollart_sdk.registry import Registrar


@hookimpl
def rollart_register_transports(registry: Registrar) -> None:
    registry.register(
        "mooncake",
        factory="rollart_transport_mooncake.transport:MooncakeTransport",
        options="rollart_transport_mooncake.transport:MooncakeTransportOptions",
        summary="publish each version once into a Mooncake store (1 GB objects); engines "
        "pull in the background into registered buffers",
        requires={"mooncake": "pip install mooncake-transfer-engine-non-cuda (CPU) plus "
                              "Debian's libibverbs1 ibverbs-providers libnl-3-200 "
                              "libnl-route-3-200 (plugins/transports/"
                              "rollart-transport-mooncake/README.md)"},
    )
