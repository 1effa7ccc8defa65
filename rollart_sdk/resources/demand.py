"""Device demand: how many devices one worker of a backend needs, said by its plugin.

A backend's options model may define

- ``device_demand(self) -> int``: the devices one worker (one Ray actor) holds, e.g. an
  engine's tensor-parallel size (vLLM ``tensor_parallel_size``, SGLang ``tp_size``). The
  ResourceManager reserves them as one placement-group bundle per worker (that many pool
  slots, and that many GPUs on a pool whose nodes have GPUs), so the actor sees them all;
- ``device_demand_fields: ClassVar[tuple[str, ...]]``: the option names the demand comes
  from, for error messages (``engine.options.tensor_parallel_size=2``);
- ``workers_multiple(self) -> int``: the role's worker count must be a multiple of it,
  e.g. a Megatron trainer's ``tensor_parallel_size x pipeline_parallel_size`` (each rank
  is one worker holding one device; a data-parallel rank is that many workers).

Without them a worker needs one device (the torch engine and trainer). The core knows no
backend by name: ``rollart validate`` (``plan_resources``) checks the demands against the
pools' device counts before any worker starts.
"""

from __future__ import annotations

from typing import Any


def device_demand(options: Any) -> int:
    """Devices one worker of the backend configured by ``options`` needs (at least 1)."""
    hook = getattr(options, "device_demand", None)
    if not callable(hook):
        return 1
    demand = int(hook())
    if demand < 1:
        raise ValueError(f"{type(options).__name__}.device_demand() returned {demand}; "
                         "a worker needs at least one device")
    return demand


def workers_multiple(options: Any) -> int:
    """The role's worker count must be a multiple of this (1: any count)."""
    hook = getattr(options, "workers_multiple", None)
    return max(1, int(hook())) if callable(hook) else 1


def demand_source(options: Any, kind: str) -> str:
    """Where a demand comes from in the config, e.g. ``engine.options.tp_size=2``."""
    fields = getattr(type(options), "device_demand_fields", ()) or ()
    parts = [f"{kind}.options.{f}={getattr(options, f, '?')}" for f in fields]
    return " x ".join(parts) if parts else f"{kind}.options"
