"""Worker: the unit of execution of the data plane (paper section 5.1).

Subclass a role's base (``ActorTrainWorker``, ``ActorGenWorker``, ``RewardWorker``,
``EnvironmentWorker``) and decorate methods with ``@register``, ``@hw_mapping`` or
``@register_serverless``. A :class:`~rollart_sdk.cluster.Cluster` runs each Worker as a Ray
actor; methods may be ``async def`` (the actor is then an asyncio actor).

Before the subclass's ``__init__`` runs, the Cluster sets ``self.rank``,
``self.world_size``, ``self.role``, ``self.binding`` (the binding record as a dict) and
the serverless proxies, so the constructor can use them (e.g. a trainer's rank).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, ClassVar

from rollart_sdk.resources.decorators import dispatch_specs
from rollart_sdk.serverless.client import ServerlessProxy


@dataclass(frozen=True)
class WorkerContext:
    """What a worker knows about its place in the Cluster."""

    rank: int
    world_size: int
    role: str
    cluster: str
    name: str
    binding: dict[str, Any] | None
    serverless_urls: dict[str, str]  # pool name -> url, for register_serverless(url=None)


class Worker:
    """Base of every role's worker; ``role`` names the role for the resource plane."""

    role: ClassVar[str] = "worker"

    rank: int = 0
    world_size: int = 1
    binding: dict[str, Any] | None = None
    cluster_name: str = ""
    worker_name: str = ""

    def _rollart_apply(self, ctx: WorkerContext) -> None:
        self.rank = ctx.rank
        self.world_size = ctx.world_size
        self.binding = ctx.binding
        self.cluster_name = ctx.cluster
        self.worker_name = ctx.name
        bound_pool = (ctx.binding or {}).get("pool")
        for spec in dispatch_specs(type(self)).values():
            if not spec.serverless_attribute:
                continue
            url = spec.serverless_url
            if url is None:
                url = ctx.serverless_urls.get(bound_pool or "") or next(
                    iter(ctx.serverless_urls.values()), None
                )
            if url is None:
                raise RuntimeError(
                    f"{type(self).__name__}.{spec.serverless_attribute}: no serverless URL; "
                    "give serverless_url= or declare a pool with kind: serverless"
                )
            setattr(self, spec.serverless_attribute,
                    ServerlessProxy(url, spec.serverless_timeout_s))

    def rollart_ready(self) -> dict[str, Any]:
        """Called once by the Cluster after construction: where the worker runs."""
        import os

        import ray

        ctx = ray.get_runtime_context()
        return {"node_id": ctx.get_node_id(), "actor_id": ctx.get_actor_id(), "pid": os.getpid()}


class ActorTrainWorker(Worker):
    """Training workers (paper default: the compute pool, e.g. H800)."""

    role: ClassVar[str] = "actor_train"


class ActorGenWorker(Worker):
    """Generation workers (paper default: the bandwidth pool, e.g. H20)."""

    role: ClassVar[str] = "actor_gen"


class RewardWorker(Worker):
    """Reward workers (paper default: a local GPU pool; or serverless)."""

    role: ClassVar[str] = "reward"


class EnvironmentWorker(Worker):
    """Environment workers (paper default: the CPU pool)."""

    role: ClassVar[str] = "environment"


# The names of the paper's Listing 1.
ActorTrainCls = ActorTrainWorker
ActorGenCls = ActorGenWorker
RewardCls = RewardWorker
EnvironmentCls = EnvironmentWorker


def bound_worker_class(worker_cls: type) -> type:
    """A subclass whose constructor takes the WorkerContext first and applies it before the
    user's ``__init__`` (so rank, binding and proxies exist during construction)."""

    def __init__(self: Any, __rollart_ctx: WorkerContext, *args: Any, **kwargs: Any) -> None:
        Worker._rollart_apply(self, __rollart_ctx)
        worker_cls.__init__(self, *args, **kwargs)  # type: ignore[misc]  # the user's own

    if not issubclass(worker_cls, Worker):
        # Plain classes work too: mix the base in so rollart_ready exists.
        bases: tuple[type, ...] = (worker_cls, Worker)
    else:
        bases = (worker_cls,)
    return type(worker_cls.__name__, bases, {"__init__": __init__,
                                            "__qualname__": worker_cls.__qualname__,
                                            "__module__": worker_cls.__module__})


def one_thread(threads: int | None = None, compute: bool = False) -> None:
    """Processes share few cores: ``threads`` torch threads (the run's thread plan,
    :mod:`rollart_sdk.resources.threads`), else ``ROLLART_TORCH_THREADS``, else one
    (oversubscription is many times slower). ``compute``: an engine or trainer, whose
    process keeps freed host memory for reuse on a machine without a GPU
    (:mod:`rollart_sdk.resources.memory`)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        import torch

        torch.set_num_threads(threads or int(os.environ.get("ROLLART_TORCH_THREADS", "1")))
    except ImportError:
        pass
    if compute:
        from rollart_sdk.resources.memory import keep_freed_memory

        keep_freed_memory()
