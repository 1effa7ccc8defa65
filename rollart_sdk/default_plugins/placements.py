"""Built-in placement policies: affinity (default), pack and spread."""

from __future__ import annotations

from rollart_sdk.hookspecs import hookimpl


@hookimpl
def rollart_register_placements(registry):
    registry.register(
        "affinity",
        factory="rollart_sdk.resources.placement:AffinityPlacement",
        summary="preferred pool first, then the first compatible pool with room",
    )
    registry.register(
        "pack",
        factory="rollart_sdk.resources.placement:PackPlacement",
        summary="fill the fullest compatible pool first (fewest nodes)",
    )
    registry.register(
        "spread",
        factory="rollart_sdk.resources.placement:SpreadPlacement",
        summary="the compatible pool with the most free capacity",
    )
