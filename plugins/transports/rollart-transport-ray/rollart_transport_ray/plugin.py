"""Registers the "ray" weight transport. Imports nothing heavy (no ray, no torch)."""

from __future__ import annotations

from rollart_sdk.hookspecs import hookimpl
from rollart_sdk.registry import Registrar


@hookimpl
def rollart_register_transports(registry: Registrar) -> None:
    registry.register(
        "ray",
        factory="rollart_transport_ray.transport:RayObjectStoreTransport",
        options="rollart_transport_ray.transport:RayTransportOptions",
        summary="publish each weight bucket once into Ray's object store; engines pull",
    )
