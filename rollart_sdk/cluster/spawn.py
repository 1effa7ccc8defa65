"""Spawners: turn a role's worker class into running workers the control plane can call.

- :class:`RaySpawner`: each role's :class:`~rollart_sdk.cluster.Cluster`, its workers bound
  to their pools by the ResourceManager and started there as Ray actors;
- :class:`LocalSpawner`: every worker as an object in this process (tests, notebooks).

Both return :class:`rollart_sdk.cluster.handles.WorkerHandle` objects and build the
LLMProxy's route table with the one routing rule (:mod:`rollart_sdk.cluster.routing`).
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from rollart_sdk.cluster.routing import route_table
from rollart_sdk.config import RunConfig

if TYPE_CHECKING:
    from rollart_sdk.cluster.worker import Worker


class Spawner(Protocol):
    """What ``rollart_sdk.job`` needs to start workers and call them synchronously."""

    def cluster(self, cls: type[Worker], name: str, init_args: tuple[Any, ...],
                workers_per_pool: dict[str, int] | None = None, num_workers: int = 1,
                concurrency: int | None = None, hw_affinity: dict[str, str] | None = None,
                max_restarts: int = 0, demand: int = 1) -> list[Any]: ...

    def routes(self, cluster: str, tags: list[str]) -> dict[str, list[str]]: ...

    def ready(self) -> None: ...

    def rebind(self, worker: str) -> None: ...

    def call(self, handle: Any, method: str, *args: Any, timeout: float = 600) -> Any: ...

    def bindings(self) -> list[dict[str, Any]]: ...

    def close(self) -> None: ...

    # In process, a sync run's one trainer thread, which the engine computes on too (the
    # engine backends that take ``compute_executor`` are offered it); None elsewhere.
    shared_compute: ThreadPoolExecutor | None


@dataclass
class _Member:
    """An in-process worker as routing sees it (it always gets its preferred pool)."""

    name: str
    pool: str
    hardware: str
    preferred: str


class RaySpawner:
    """Builds each role's Cluster: workers bound to their pools by the ResourceManager and
    started there as Ray actors. ``cluster`` launches and returns at once; ``ready`` waits
    for every worker of every cluster (they start concurrently)."""

    shared_compute: ThreadPoolExecutor | None = None  # each worker a process of its own

    def __init__(self, cfg: RunConfig, plan: Any, policy: Any, namespace: str) -> None:
        import ray

        from rollart_sdk.ray_utils import init_ray
        from rollart_sdk.resources.manager import ResourceManager

        resources, labels = plan.local_node_resources()
        # Ray started (or connected) here is shut down by close(); one started by the
        # caller (a notebook, a test's fixture) is left as it was.
        self.owns_ray = not ray.is_initialized()
        init_ray(address=cfg.ray.address, num_cpus=cfg.ray.num_cpus or max(4, os.cpu_count() or 2),
                 resources=resources, labels=labels)
        self.plan = plan
        self.rm = ResourceManager(plan, policy=policy, namespace=namespace)
        self.clusters: dict[str, Any] = {}

    def cluster(self, cls: type[Worker], name: str, init_args: tuple[Any, ...],
                workers_per_pool: dict[str, int] | None = None, num_workers: int = 1,
                concurrency: int | None = None, hw_affinity: dict[str, str] | None = None,
                max_restarts: int = 0, demand: int = 1) -> list[Any]:
        from rollart_sdk.cluster import Cluster
        from rollart_sdk.cluster.handles import WorkerHandle

        # ``demand``: devices per worker (an engine's tensor-parallel size), reserved as one
        # placement-group bundle of that many pool slots (and GPUs on GPU nodes).
        opts: dict[str, Any] = {"max_concurrency": concurrency} if concurrency else {}
        if max_restarts:
            # Ray restarts a dead worker's process in the same reservation (its __init__
            # runs again); calls in flight fail at once (no task retries): the caller
            # re-sends them elsewhere (control/proxy.py, control/recovery.py).
            opts.update(max_restarts=max_restarts, max_task_retries=0)
        cl = Cluster(cls, cls.role, self.rm, num_workers=None if workers_per_pool else num_workers,
                     workers_per_pool=workers_per_pool, init_args=init_args, name=name,
                     hw_affinity=hw_affinity, actor_options=opts or None, demand=demand,
                     timeout_s=_start_timeout_s(), wait=False)
        self.clusters[name] = cl
        return [WorkerHandle(w.name, w.actor, pool=w.pool, hardware=w.hardware) for w in cl.workers]

    def ready(self) -> None:
        """Wait for every launched worker: all clusters start at the same time (start-up
        costs the slowest worker's, not the sum); the first failure tears all down."""
        try:
            for cl in self.clusters.values():
                cl.wait_ready()
        except BaseException:
            self.close()
            raise

    def routes(self, cluster: str, tags: list[str]) -> dict[str, list[str]]:
        cl = self.clusters[cluster]
        return route_table(cl.workers, cl.hw_affinity or {}, self.plan.pools, tags)

    def rebind(self, worker: str) -> None:
        """A worker's process was restarted by Ray: its binding record (the GCS store)
        counts the restart; the reservation (pool, node, placement group) is the same."""
        b = next((b for b in self.rm.bindings() if b.worker == worker), None)
        if b is None:
            raise KeyError(f"no binding record for worker {worker!r}")
        self.rm.annotate(worker, restarts=b.restarts + 1)

    def call(self, handle: Any, method: str, *args: Any, timeout: float = 600) -> Any:
        import ray

        return ray.get(getattr(handle.target, method).remote(*args), timeout=timeout)

    def bindings(self) -> list[dict[str, Any]]:
        return [b.to_json() for b in self.rm.bindings()]

    def close(self) -> None:
        """Tear down in order: every role's workers (each cluster's actors and placement
        groups), then this driver's Ray (a local one: its GCS and raylet stop; a cluster
        at ``--address``: this driver disconnects). Ray's own exit hook then has nothing
        left to do."""
        for cl in self.clusters.values():
            try:
                cl.shutdown()
            except Exception:  # noqa: BLE001 - best effort at shutdown
                pass
        self.clusters.clear()
        if self.owns_ray:
            import ray

            self.owns_ray = False
            ray.shutdown()


class LocalSpawner:
    """Every worker as an object in this process (tests, notebooks): the same worker classes
    and control plane, no Ray. Pools are recorded as planned; nothing is reserved."""

    def __init__(self, plan: Any, inline: bool = False, share_compute: bool = False) -> None:
        """``inline``: the handles call the workers' plain methods on the event loop, not
        on a thread (a run on virtual time: a thread's work would take no virtual time
        and land at an order the wall clock decides). ``share_compute``: the trainer's
        one worker thread is kept as :attr:`shared_compute`, for the engine to compute on
        too (:func:`shares_compute`)."""
        self.plan = plan
        self.inline = inline
        self.share_compute = share_compute and not inline
        if not inline:
            # Before the workers' threads exist: they are to share the main heap
            # (resources/memory.py; a CPU machine's tensors live in host memory).
            from rollart_sdk.resources.memory import keep_freed_memory

            keep_freed_memory(one_arena=True)
        self.shared_compute: ThreadPoolExecutor | None = None
        self._bindings: list[dict[str, Any]] = []
        self._members: dict[str, tuple[list[_Member], dict[str, str]]] = {}
        self._threads: list[ThreadPoolExecutor] = []

    def _own_thread(self, name: str) -> ThreadPoolExecutor:
        """A worker's one thread for its blocking methods (closed with the spawner)."""
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._threads.append(pool)
        return pool

    def cluster(self, cls: type[Worker], name: str, init_args: tuple[Any, ...],
                workers_per_pool: dict[str, int] | None = None, num_workers: int = 1,
                concurrency: int | None = None, hw_affinity: dict[str, str] | None = None,
                max_restarts: int = 0, demand: int = 1) -> list[Any]:
        from rollart_sdk.cluster.handles import WorkerHandle
        from rollart_sdk.cluster.worker import WorkerContext, bound_worker_class

        pools = ([p for p, n in workers_per_pool.items() for _ in range(n)] if workers_per_pool
                 else [self.plan.role(cls.role).preferred] * num_workers)
        handles, members = [], []
        for rank, pool in enumerate(pools):
            wname = f"{name}-{rank}"
            hw = self.plan.pool(pool).hardware
            binding = {"worker": wname, "role": cls.role, "pool": pool, "preferred": pool,
                       "hardware": hw, "demand": demand}
            self._bindings.append(binding)
            ctx = WorkerContext(rank, len(pools), cls.role, name, wname, binding, {})
            # A worker that is not concurrent gets one thread of its own, like its actor,
            # and is built there (what its __init__ sets per thread, torch's thread count,
            # holds for its methods).
            own = None if self.inline or concurrency else self._own_thread(wname)
            if own is not None and self.share_compute and cls.role == "actor_train":
                self.shared_compute = own if len(pools) == 1 else None
            make = bound_worker_class(cls)
            obj = make(ctx, *init_args) if own is None else own.submit(
                make, ctx, *init_args).result()
            handles.append(WorkerHandle(wname, obj, pool=pool, hardware=hw, is_ray=False,
                                        inline=self.inline, executor=own))
            members.append(_Member(wname, pool, hw, pool))
        self._members[name] = (members, dict(hw_affinity or {}))
        return handles

    def ready(self) -> None:
        pass  # in-process workers are ready when constructed

    def routes(self, cluster: str, tags: list[str]) -> dict[str, list[str]]:
        members, table = self._members[cluster]
        return route_table(members, table, self.plan.pools, tags)

    def rebind(self, worker: str) -> None:
        for b in self._bindings:
            if b["worker"] == worker:
                b["restarts"] = b.get("restarts", 0) + 1
                return
        raise KeyError(f"no binding record for worker {worker!r}")

    def call(self, handle: Any, method: str, *args: Any, timeout: float = 600) -> Any:
        result = getattr(handle.target, method)(*args)
        if asyncio.iscoroutine(result):
            result = asyncio.run(result)
        return result

    def bindings(self) -> list[dict[str, Any]]:
        return list(self._bindings)

    def close(self) -> None:
        for pool in self._threads:
            pool.shutdown(wait=False, cancel_futures=True)
        self._threads.clear()


def shares_compute(cfg: RunConfig, in_process: bool) -> bool:
    """Whether the engine computes on the trainer's thread: a sync run in one process with
    one trainer rank, one engine (no prefill-decode split), the in-memory transport and
    no ``train.stream_groups``.
    Engine and trainer then alternate (every token is generated before the step that
    trains on it, by the weights the step before produced), so one thread serves both,
    and its one OpenMP team: with a second team anywhere in the process, GNU OpenMP stops
    spinning at the barriers of both (its spin is throttled once the threads it manages
    outnumber the cores), which cost SmolLM2's train step 40 % (docs/benchmarks.md). The
    engine thereby gets the trainer's threads, every core, for its batched steps."""
    from rollart_sdk.layout import IN_PROCESS_TRANSPORTS

    gen = cfg.roles.actor_gen
    return (in_process and cfg.rollout.mode == "sync" and not gen.disaggregated
            and gen.workers == 1 and cfg.roles.actor_train.workers == 1
            # train.stream_groups trains the first groups while the rollout goes on
            and cfg.train.stream_groups is False
            # the in-memory hand-over: a push transport's publish would wait for the
            # engine's receive, queued behind it on the one thread
            and cfg.transport.name in IN_PROCESS_TRANSPORTS)


def _start_timeout_s() -> float:
    """How long a cluster's workers may take to start (a vLLM engine on a busy CPU machine
    can take minutes); ROLLART_WORKER_START_TIMEOUT_S overrides the default 300 s."""
    return float(os.environ.get("ROLLART_WORKER_START_TIMEOUT_S", "300"))
