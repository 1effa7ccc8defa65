"""Where a run's workers live: in the ``rollart train`` process, or one Ray actor each.

``layout: inprocess`` runs every role worker (trainer, engines, reward, env hosts) as an
object in the driver's process: the same worker classes and control plane, the ``local``
transport (weights handed over in memory), no Ray started. ``layout: ray`` starts (or
joins) Ray and binds one actor per worker to its pool. ``layout: auto`` (the default)
picks ``inprocess`` when nothing in the run needs a process of its own, else ``ray``;
:func:`choose_layout` says which and why, and the run directory records it
(``plan.json``, ``summary.json``), as the console's ``layout:`` line does.

The rules of ``auto``, in order (the first that applies is the reason given):

1. a Ray address (``--address``, ``RAY_ADDRESS``, ``ray.address``): the run may span
   nodes -> ``ray``;
2. a pool with ``labels``: it selects Ray nodes -> ``ray``;
3. an engine or trainer other than the first-party ``torch`` ones (vLLM, SGLang,
   Megatron and any third-party backend start their own processes and device pools)
   -> ``ray``;
4. a data-parallel trainer (``roles.actor_train.workers`` > 1): each rank is a process
   of its own (torch.distributed) -> ``ray``;
5. a transport other than ``ray`` or ``local`` (``nccl``, ``mooncake`` move weights
   between processes and devices) -> ``ray``;
6. a reward or env whose registration declares resources (e.g. a judge reward model on
   a GPU): it gets a worker on its pool -> ``ray``;
7. otherwise ``inprocess``.

In ``inprocess`` the ``ray`` transport is replaced by ``local`` (there is no object
store; the config file keeps its value, so the run resumes in either layout).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rollart_sdk.errors import ConfigError

if TYPE_CHECKING:
    from rollart_sdk.config import RunConfig
    from rollart_sdk.registry import Registry

IN_PROCESS_BACKENDS = {"engine": {"torch"}, "trainer": {"torch"}}
IN_PROCESS_TRANSPORTS = {"ray", "local"}


@dataclass(frozen=True)
class Layout:
    """The layout a run uses: ``name`` (inprocess or ray), what the config asked for
    (``asked``: auto, inprocess or ray) and why this one."""

    name: str
    asked: str
    why: str

    @property
    def in_process(self) -> bool:
        return self.name == "inprocess"

    def to_json(self) -> dict[str, Any]:
        return {"layout": self.name, "asked": self.asked, "why": self.why}

    def line(self) -> str:
        """The console line, e.g. ``layout: ray (auto: a Ray address is given (...))``."""
        return f"layout: {self.name} ({'auto: ' if self.asked == 'auto' else ''}{self.why})"


def choose_layout(cfg: RunConfig, registry: Registry | None = None) -> Layout:
    """The run's layout: ``cfg.layout`` when set, else by the rules of ``auto`` (module
    docstring). An explicit ``inprocess`` that cannot work (a data-parallel trainer, a
    transport between processes) is a ConfigError saying why; the other reasons of
    ``auto`` are the user's to override (e.g. a judge reward model in this process)."""
    if cfg.layout == "ray":
        return Layout("ray", "ray", "set in the config")
    if cfg.layout == "inprocess":
        impossible = _multiprocess_only(cfg)
        if impossible is not None:
            raise ConfigError([("layout", f"inprocess cannot run this config: {impossible}; "
                                "use layout: ray (or auto)")])
        return Layout("inprocess", "inprocess", "set in the config")
    why = _needs_ray(cfg, registry)
    if why is not None:
        return Layout("ray", "auto", why)
    return Layout("inprocess", "auto", "one machine, every worker can share this process")


def _multiprocess_only(cfg: RunConfig) -> str | None:
    """Why this run's workers cannot share one process (rules 4 and 5), or None."""
    if cfg.roles.actor_train.workers > 1:
        return (f"the trainer has {cfg.roles.actor_train.workers} data-parallel ranks, each a "
                "process of its own")
    if cfg.transport.name not in IN_PROCESS_TRANSPORTS:
        return f"transport {cfg.transport.name!r} moves weights between processes"
    return None


def _needs_ray(cfg: RunConfig, registry: Registry | None) -> str | None:
    """Why this run needs Ray (rules 1-6 of the module docstring), or None."""
    address = cfg.ray.address or os.environ.get("RAY_ADDRESS")
    if address:
        return f"a Ray address is given ({address})"
    labelled = [p.name for p in cfg.pools if p.labels]
    if labelled:
        return f"pool {labelled[0]!r} selects Ray nodes by labels"
    for kind in ("engine", "trainer"):
        name = getattr(cfg, kind).name
        if name not in IN_PROCESS_BACKENDS[kind]:
            return f"{kind} {name!r} runs in processes of its own"
    impossible = _multiprocess_only(cfg)
    if impossible is not None:
        return impossible
    declared = _resource_backends(cfg, registry)
    if declared:
        return f"{declared[0]} declares resources for a worker of its own"
    return None


def _resource_backends(cfg: RunConfig, registry: Registry | None) -> list[str]:
    """Rewards and envs whose registration declares resources (``Descriptor.resources``),
    as ``"reward 'judge' (tasks.0)"``; an unknown name is left to the resolver's error."""
    if registry is None:
        from rollart_sdk.plugins import get_plugins

        registry = get_plugins().registry
    out = []
    for i, task in enumerate(cfg.tasks):
        for kind, backend in (("reward", task.reward), ("env", task.env)):
            try:
                desc = registry.get(kind, backend.name)
            except Exception:  # noqa: BLE001 - resolve_run reports it with its line
                continue
            if desc.resources:
                out.append(f"{kind} {backend.name!r} (tasks.{i})")
    return out


def inprocess_config(cfg: RunConfig) -> RunConfig:
    """The config the in-process workers are built from: the ``ray`` transport becomes
    ``local`` (no object store in one process; the weights are handed over in memory)."""
    if cfg.transport.name != "ray":
        return cfg
    from rollart_sdk.config import Backend

    return cfg.model_copy(update={"transport": Backend(name="local")})
