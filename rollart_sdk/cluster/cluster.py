"""Cluster: a role's group of Workers as Ray actors, with their methods bound onto it.

``Cluster(MyGen, "actor_gen", rm, workers_per_pool={"H800": 2, "H20": 4})`` binds each
worker through the ResourceManager (pool choice, fallback, record), starts the actors
inside their reservations, and binds every decorated method onto the Cluster:

- ``cluster.method(...)`` dispatches per the decorator and blocks for the gathered result
  (a list for ``execute_all``/``dp_split``, one value for ``rank0``/``one``/``hw_mapping``);
- ``cluster.method.refs(...)`` returns the ObjectRef(s) instead, for asyncio code
  (``await ref``).

The dispatch path is kept to a few dictionary and list look-ups on top of Ray's own
``actor.method.remote`` (see ``rollart bench dispatch``).
"""

from __future__ import annotations

import inspect
import itertools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rollart_sdk.cluster.routing import workers_for_tag
from rollart_sdk.cluster.worker import WorkerContext, bound_worker_class
from rollart_sdk.errors import PlacementError, RollartError
from rollart_sdk.resources.decorators import (
    DispatchSpec,
    check_worker_class,
    dispatch_specs,
    dp_shards,
)
from rollart_sdk.resources.manager import Binding, ResourceManager


@dataclass
class ClusterMember:
    """One worker of a Cluster: its actor, its binding record and its rank.

    (The control plane calls workers through :class:`rollart_sdk.cluster.handles.WorkerHandle`.)"""

    actor: Any
    binding: Binding
    rank: int
    name: str
    node_id: str | None = None

    @property
    def pool(self) -> str:
        return self.binding.pool

    @property
    def hardware(self) -> str:
        return self.binding.hardware

    @property
    def preferred(self) -> str:
        return self.binding.preferred


class ClusterMethod:
    """A Worker method bound onto a Cluster (see the module docstring)."""

    def __init__(self, cluster: Cluster, name: str, spec: DispatchSpec) -> None:
        self.cluster = cluster
        self.name = name
        self.spec = spec
        self.__doc__ = getattr(getattr(cluster.worker_cls, name), "__doc__", None)
        self._methods = [getattr(w.actor, name) for w in cluster.workers]
        self._rr = itertools.count()
        self._tag_pos: int | None = None
        self._routes: dict[str, tuple[list[int], Any]] = {}  # tag -> (ranks, round robin)
        if spec.mode == "tag":
            params = list(inspect.signature(getattr(cluster.worker_cls, name)).parameters)
            if spec.tag_arg in params:
                self._tag_pos = params.index(spec.tag_arg) - 1  # without self
        mode = spec.mode
        self.refs = {  # one attribute look-up per call instead of a chain of ifs
            "execute_all": self._all,
            "rank0": self._rank0,
            "one": self._one,
            "dp_split": self._split,
            "tag": self._tag,
        }[mode]
        self._many = mode in ("execute_all", "dp_split")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import ray

        out = ray.get(self.refs(*args, **kwargs))
        if self._many and self.spec.collect == "concat":
            return [x for part in out for x in part]
        return out

    # ---------------------------------------------------------------- modes

    def _all(self, *args: Any, **kwargs: Any) -> list[Any]:
        return [m.remote(*args, **kwargs) for m in self._methods]

    def _rank0(self, *args: Any, **kwargs: Any) -> Any:
        return self._methods[0].remote(*args, **kwargs)

    def _one(self, *args: Any, **kwargs: Any) -> Any:
        return self._methods[next(self._rr) % len(self._methods)].remote(*args, **kwargs)

    def _split(self, data: Sequence[Any], *args: Any, **kwargs: Any) -> list[Any]:
        shards = dp_shards(data, len(self._methods))
        return [m.remote(shard, *args, **kwargs)
                for m, shard in zip(self._methods, shards, strict=True)]

    def _tag(self, *args: Any, **kwargs: Any) -> Any:
        tag = kwargs.get(self.spec.tag_arg)
        if tag is None:
            pos = self._tag_pos
            tag = args[pos] if pos is not None and pos < len(args) else "default"
        route = self._routes.get(tag)
        if route is None:
            ranks = [w.rank for w in self.cluster._route(self.spec, tag)]
            route = self._routes[tag] = (ranks, itertools.count())
        ranks, rr = route
        return self._methods[ranks[next(rr) % len(ranks)]].remote(*args, **kwargs)


class Cluster:
    """A group of one role's workers on their bound resources, acting as their proxy.

    Give ``num_workers`` (all preferring the role's pool) or ``workers_per_pool``
    (``{pool: n}``, each group preferring its pool). ``hw_affinity`` overrides the
    ``@hw_mapping`` table of every tag-routed method (e.g. from the config's task
    affinities: ``plan.hw_affinity()``). ``actor_options`` are extra Ray actor options
    (``max_concurrency``, ``runtime_env``, ``num_cpus``...).
    """

    def __init__(
        self,
        worker_cls: type,
        role: str | None = None,
        resource_manager: ResourceManager | None = None,
        num_workers: int | None = None,
        workers_per_pool: Mapping[str, int] | None = None,
        init_args: Sequence[Any] = (),
        init_kwargs: Mapping[str, Any] | None = None,
        name: str | None = None,
        demand: float = 1.0,
        hw_affinity: Mapping[str, str] | None = None,
        actor_options: Mapping[str, Any] | None = None,
        timeout_s: float = 120.0,
        wait: bool = True,
    ) -> None:
        """``wait=False``: return once the actors are launched; ``wait_ready()`` then waits
        for them (so that several clusters start at the same time)."""

        if resource_manager is None:
            raise RollartError("Cluster needs a ResourceManager (resources.ResourceManager(pools))")
        self.worker_cls = worker_cls
        self.role: str = role or str(getattr(worker_cls, "role", "worker"))
        self.rm = resource_manager
        self.name = name or f"{self.role}-{worker_cls.__name__}"
        self.hw_affinity = dict(hw_affinity) if hw_affinity else None
        self.workers: list[ClusterMember] = []
        self._specs = dispatch_specs(worker_cls)

        self._check()
        if workers_per_pool:
            plan: list[str | None] = [p for p, n in workers_per_pool.items() for _ in range(int(n))]
        else:
            n = num_workers if num_workers is not None else self.rm.role_plan(self.role).workers
            plan = [None] * int(n)
        if not plan:
            raise RollartError(f"cluster {self.name}: zero workers requested")
        self._ready: list[Any] = []
        self._deadline = time.monotonic() + timeout_s
        self._timeout_s = timeout_s
        self._start(plan, demand, init_args, init_kwargs or {}, actor_options or {}, timeout_s)
        if wait:
            self.wait_ready()
        for attr, spec in self._specs.items():
            setattr(self, attr, ClusterMethod(self, attr, spec))

    def _check(self) -> None:
        """Misuse is a config error, raised before anything is reserved or started."""
        check_worker_class(self.worker_cls, self.rm.pools, where=self.name)
        if self.hw_affinity:
            provided = {p.name for p in self.rm.pools} | {p.hardware for p in self.rm.pools}
            bad = {t: h for t, h in self.hw_affinity.items() if h not in provided}
            if bad:
                raise PlacementError(
                    f"cluster {self.name}: hw_affinity maps {bad} to hardware no pool provides "
                    f"({', '.join(sorted(provided))})"
                )
        for attr in self._specs:
            if hasattr(type(self), attr) or attr in ("rm", "name", "role", "workers"):
                raise RollartError(
                    f"{self.worker_cls.__name__}.{attr} clashes with Cluster.{attr}; rename the method"
                )

    def _start(self, plan: list[str | None], demand: float, init_args: Sequence[Any],
               init_kwargs: Mapping[str, Any], actor_options: Mapping[str, Any],
               timeout_s: float) -> None:
        """Bind every worker (in rank order) and launch the actors in their reservations
        (``wait_ready`` waits for them); on any failure tear down what was started."""
        import ray

        deadline = time.monotonic() + timeout_s
        bindings: list[Binding] = []
        try:
            for rank, pool in enumerate(plan):
                left = max(1.0, deadline - time.monotonic())
                bindings.append(self.rm.bind(f"{self.name}-{rank}", self.role, pool, demand, left))
            actor_cls: Any = ray.remote(bound_worker_class(self.worker_cls))
            urls = {p.name: p.url for p in self.rm.pools if p.kind == "serverless" and p.url}
            for rank, b in enumerate(bindings):
                ctx = WorkerContext(rank, len(plan), self.role, self.name, b.worker, b.to_json(), urls)
                opts = {**b.actor_options(), **actor_options}
                actor = actor_cls.options(**opts).remote(ctx, *init_args, **init_kwargs)
                self.workers.append(ClusterMember(actor, b, rank, b.worker))
            self._ready = [w.actor.rollart_ready.remote() for w in self.workers]
        except BaseException:
            self._teardown([b.worker for b in bindings])
            raise

    def wait_ready(self) -> None:
        """Wait until every worker answers (its ``__init__`` ran); on a failure or the
        start timeout, tear the cluster down and raise."""
        import ray

        if not self._ready:
            return
        ready, self._ready = self._ready, []
        try:
            left = max(1.0, self._deadline - time.monotonic())
            done, pending = ray.wait(ready, num_returns=len(ready), timeout=left)
            if pending:
                late = [w.name for w, r in zip(self.workers, ready, strict=True) if r in pending]
                raise PlacementError(
                    f"cluster {self.name}: workers {late} did not start within "
                    f"{self._timeout_s:g}s (their pool may lack CPU/memory for a process); "
                    "see `ray status`"
                )
            for w, info in zip(self.workers, ray.get(ready), strict=True):
                w.node_id = info["node_id"]
                self.rm.annotate(w.name, node_id=info["node_id"], actor_id=info["actor_id"])
        except BaseException:
            self.shutdown()
            raise

    def __getattr__(self, name: str) -> ClusterMethod:
        # Only reached when normal lookup fails: the worker class has no such method.
        raise AttributeError(
            f"cluster {self.__dict__.get('name', '?')}: no method {name!r} (methods: "
            f"{', '.join(self.__dict__.get('_specs', {})) or 'none'}); decorate it with "
            "@register, @hw_mapping or @register_serverless"
        )

    # ---------------------------------------------------------------- routing

    def _route(self, spec: DispatchSpec, tag: str) -> list[ClusterMember]:
        """Workers for ``tag`` under this cluster's table (see :mod:`.routing`)."""
        return workers_for_tag(self.workers, self.hw_affinity or spec.hw_affinity, self.rm.pools, tag)

    def workers_for_tag(self, method_name: str, tag: str) -> list[ClusterMember]:
        """Candidate workers for a tag-routed method (for callers doing their own, e.g.
        sticky, routing among them)."""
        spec = self._specs.get(method_name)
        if spec is None or spec.mode != "tag":
            raise RollartError(f"{self.worker_cls.__name__}.{method_name} is not an @hw_mapping method")
        return self._route(spec, tag)

    # ---------------------------------------------------------------- lifetime

    def bindings(self) -> list[Binding]:
        return [w.binding for w in self.workers]

    def _teardown(self, names: list[str]) -> None:
        import ray

        for w in self.workers:
            try:
                ray.kill(w.actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already dead
                pass
        for n in names:
            self.rm.release(n)

    def shutdown(self) -> None:
        """Kill the actors and release their reservations and records."""
        self._teardown([w.name for w in self.workers])
        self.workers = []

    def __repr__(self) -> str:
        where = ", ".join(f"{w.rank}:{w.pool}" for w in self.workers)
        return f"Cluster({self.name}, role={self.role}, workers=[{where}])"
