"""The ResourceManager: binds workers to pools on Ray and records every binding.

How a pool reaches Ray: each node of a pool carries the custom resource ``pool:<name>``
(one unit per slot) and, optionally, the pool's labels. Binding a worker reserves
``{pool:<name>: demand}`` (plus GPUs when the pool's nodes have them) in a one-bundle
placement group, with the pool's labels as the bundle's label selector. Ray picks the node;
the manager only picks the pool (through the placement policy plugin) and, when the
preferred pool cannot take the worker, falls back to a compatible one instead of waiting.

Every binding (worker, role, pool, hardware, node, preferred vs actual, reason) is written
to Ray's GCS key-value store under the job namespace, so ``rollart status`` (another
process) and dispatch/failover code read the same records.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from rollart_sdk.config import PoolConfig
from rollart_sdk.errors import PlacementError
from rollart_sdk.interfaces import PlacementPolicy
from rollart_sdk.resources.placement import AffinityPlacement
from rollart_sdk.resources.plan import (
    ResourcePlan,
    RolePlan,
    pool_resource,
    pools_from_spec,
    role_plan_from_pools,
)

KV_NAMESPACE = "rollart"
KV_PREFIX = "bindings/"


@dataclass
class Binding:
    """Where one worker was placed, and why."""

    worker: str
    role: str
    pool: str  # the pool actually used
    hardware: str
    preferred: str
    reason: str
    demand: float = 1.0
    namespace: str = "default"
    node_id: str | None = None
    pg_id: str | None = None  # placement group holding the reservation (None: serverless)
    gpus: float = 0.0
    job_id: str | None = None
    actor_id: str | None = None
    bound_at: float = field(default_factory=time.time)
    restarts: int = 0  # times the worker's process was restarted (same reservation)

    @property
    def actual(self) -> str:
        return self.pool

    @property
    def fallback(self) -> bool:
        """True when the worker is not on its preferred pool."""
        return self.pool != self.preferred

    def actor_options(self) -> dict[str, Any]:
        """Keyword arguments for ``ActorClass.options(**...)`` that put the actor inside
        the reservation (pool resource, GPUs, node chosen by Ray)."""
        opts: dict[str, Any] = {"num_cpus": 0}
        if self.pg_id is None:
            return opts
        from ray._raylet import PlacementGroupID
        from ray.util.placement_group import PlacementGroup
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        pg = PlacementGroup(PlacementGroupID.from_hex(self.pg_id))
        opts["resources"] = {pool_resource(self.pool): self.demand}
        if self.gpus:
            opts["num_gpus"] = self.gpus
        opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
            placement_group=pg, placement_group_bundle_index=0
        )
        return opts

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["actual"] = self.actual
        d["fallback"] = self.fallback
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Binding:
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in d.items() if k in names})


class BindingStore:
    """Binding records in Ray's GCS key-value store (shared by every process of a cluster).

    Keys are ``bindings/<namespace>/<worker>`` in the KV namespace ``rollart``.
    """

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace

    @staticmethod
    def _kv() -> Any:
        from ray.experimental import internal_kv

        return internal_kv

    def _key(self, worker: str) -> str:
        return f"{KV_PREFIX}{self.namespace}/{worker}"

    def put(self, b: Binding) -> None:
        self._kv()._internal_kv_put(
            self._key(b.worker), json.dumps(b.to_json()), overwrite=True, namespace=KV_NAMESPACE
        )

    def get(self, worker: str) -> Binding | None:
        raw = self._kv()._internal_kv_get(self._key(worker), namespace=KV_NAMESPACE)
        return Binding.from_json(json.loads(raw)) if raw else None

    def delete(self, worker: str) -> None:
        self._kv()._internal_kv_del(self._key(worker), namespace=KV_NAMESPACE)

    def list(self) -> list[Binding]:
        return read_bindings(self.namespace)


def read_bindings(namespace: str | None = None) -> list[Binding]:
    """Every binding record of ``namespace`` (all namespaces when None), from the GCS."""
    from ray.experimental import internal_kv

    prefix = KV_PREFIX + (f"{namespace}/" if namespace is not None else "")
    out: list[Binding] = []
    for key in internal_kv._internal_kv_list(prefix, namespace=KV_NAMESPACE):
        raw = internal_kv._internal_kv_get(key, namespace=KV_NAMESPACE)
        if raw:
            out.append(Binding.from_json(json.loads(raw)))
    out.sort(key=lambda b: (b.namespace, b.bound_at, b.worker))
    return out


class ResourceManager:
    """Interprets pool declarations and binds workers to them on the connected Ray cluster.

    ``plan_or_pools``: a :class:`ResourcePlan`, a list of ``PoolConfig``, or the paper's
    shorthand ``{"H800": 8, "H20": 24}``. ``policy``: a PlacementPolicy, or the name of a
    registered one (``affinity``, ``pack``, ``spread`` or a plugin's).
    ``probe_s`` bounds how long one pool may take to reserve a slot before the manager
    treats it as unavailable and falls back.
    """

    def __init__(
        self,
        plan_or_pools: ResourcePlan | list[PoolConfig] | dict[str, Any],
        policy: PlacementPolicy | str | None = None,
        namespace: str = "default",
        probe_s: float = 5.0,
    ) -> None:
        self.plan = plan_or_pools if isinstance(plan_or_pools, ResourcePlan) else None
        self.pools: list[PoolConfig] = pools_from_spec(plan_or_pools)
        if not self.pools:
            raise PlacementError("a ResourceManager needs at least one pool")
        self._by_name = {p.name: p for p in self.pools}
        if isinstance(policy, str):
            from rollart_sdk.plugins import get_registry

            policy = get_registry().get("placement", policy).create()
        self.policy: PlacementPolicy = policy or AffinityPlacement()  # type: ignore[assignment]
        self.namespace = namespace
        self.probe_s = probe_s
        self.store = BindingStore(namespace)
        self._mine: dict[str, Binding] = {}
        self._purge_stale()

    # ------------------------------------------------------------------ pools and roles

    def pool(self, name: str) -> PoolConfig:
        try:
            return self._by_name[name]
        except KeyError:
            raise PlacementError(
                f"no pool named {name!r}; pools: {', '.join(self._by_name)}"
            ) from None

    def role_plan(self, role: str) -> RolePlan:
        """The role's preferred pool and fallbacks (from the plan, else the paper defaults)."""
        if self.plan is not None and role in self.plan.roles:
            return self.plan.roles[role]
        if role not in ("actor_train", "actor_gen", "environment", "reward"):
            # A custom role: any non-serverless pool, in declaration order.
            names = [p.name for p in self.pools if p.kind != "serverless"] or [self.pools[0].name]
            return RolePlan(role, names[0], names[1:], 1, {names[0]: 1})
        return role_plan_from_pools(self.pools, role)

    def capacity(self) -> dict[str, dict[str, float]]:
        """Live view per pool: ``total`` slots on alive nodes, ``free`` slots not held by
        any recorded binding (every namespace's), ``bound`` slots held by this manager.

        Free room is counted from the binding records, which change synchronously with
        each bind and release; Ray's own available-resources view lags a placement group
        by a heartbeat. Anything else holding a pool's resource is caught when the
        reservation does not come through within ``probe_s``.
        """
        import ray

        total_res = ray.cluster_resources()
        held: dict[str, float] = {}
        for b in read_bindings(None):
            held[b.pool] = held.get(b.pool, 0.0) + b.demand
        out: dict[str, dict[str, float]] = {}
        for p in self.pools:
            bound = sum(b.demand for b in self._mine.values() if b.pool == p.name)
            if p.kind == "serverless":
                total = float(p.count)
            else:
                total = float(total_res.get(pool_resource(p.name), 0.0))
            free = total - max(bound, held.get(p.name, 0.0))
            out[p.name] = {"total": total, "free": max(0.0, free), "bound": bound}
        return out

    # ------------------------------------------------------------------ binding

    def bind(
        self,
        worker_name: str,
        role: str,
        preferred_pool: str | None = None,
        demand: float = 1.0,
        timeout_s: float = 60.0,
        fallbacks: Iterable[str] | None = None,
    ) -> Binding:
        """Reserve room for one worker and record where it went.

        Tries the policy's choice; a pool that cannot reserve within ``probe_s`` is
        counted as unavailable and the policy chooses again. Raises PlacementError naming
        the pools when nothing fits, always within ``timeout_s``.
        """
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group

        if worker_name in self._mine:
            raise PlacementError(f"worker {worker_name!r} is already bound in namespace {self.namespace!r}")
        rp = self.role_plan(role)
        preferred = preferred_pool or rp.preferred
        self.pool(preferred)  # unknown name -> clear error
        rest = list(fallbacks) if fallbacks is not None else rp.candidates
        candidates = [preferred, *[c for c in rest if c != preferred and c in self._by_name]]
        deadline = time.monotonic() + timeout_s
        unavailable: dict[str, str] = {}
        job_id = ray.get_runtime_context().get_job_id()
        nodes = None
        for _ in range(len(candidates) + 1):
            cap = self.capacity()
            free = {c: (0.0 if c in unavailable else cap[c]["free"]) for c in candidates}
            pool_name, reason = self.policy.choose(role, preferred, candidates, free, demand)
            if pool_name is None or pool_name not in self._by_name:
                raise PlacementError(self._no_room(worker_name, role, demand, preferred,
                                                   candidates, cap, unavailable, reason))
            pool = self._by_name[pool_name]
            if unavailable.get(preferred) and pool_name != preferred:
                reason = f"{reason}; {preferred}: {unavailable[preferred]}"
            binding = Binding(
                worker=worker_name, role=role, pool=pool_name, hardware=pool.hardware,
                preferred=preferred, reason=reason, demand=demand, namespace=self.namespace,
                job_id=job_id,
            )
            if pool.kind != "serverless":
                nodes = nodes if nodes is not None else [n for n in ray.nodes() if n.get("Alive")]
                bundle, selector, gpus = self._bundle(pool, demand, nodes)
                pg = placement_group(
                    [bundle],
                    name=f"rollart:{self.namespace}:{worker_name}",
                    bundle_label_selector=[selector] if selector else None,
                )
                wait = max(0.1, min(self.probe_s, deadline - time.monotonic()))
                if not pg.wait(wait):
                    remove_placement_group(pg)
                    unavailable[pool_name] = (
                        f"could not reserve {demand:g} x {pool_resource(pool_name)}"
                        f"{f' on nodes labelled {selector}' if selector else ''} within {wait:.1f}s"
                    )
                    if time.monotonic() >= deadline:
                        raise PlacementError(self._no_room(worker_name, role, demand, preferred,
                                                           candidates, cap, unavailable, reason))
                    continue
                binding.pg_id = pg.id.hex()
                binding.gpus = gpus
                binding.node_id = _pg_node(pg)
            self._mine[worker_name] = binding
            self.store.put(binding)
            return binding
        raise PlacementError(self._no_room(worker_name, role, demand, preferred, candidates,
                                           self.capacity(), unavailable, "every pool tried"))

    def _bundle(
        self, pool: PoolConfig, demand: float, nodes: list[dict[str, Any]]
    ) -> tuple[dict[str, float], dict[str, str], float]:
        """The reservation for one worker of ``pool`` on the nodes that serve it.

        Labels are used as a selector only when some node of the pool carries them (on one
        machine, pools whose labels clash share a node that carries none of them); GPUs are
        reserved only when the pool's nodes have GPUs (test clusters fake pools without).
        """
        res = pool_resource(pool.name)
        members = [n for n in nodes if n.get("Resources", {}).get(res, 0) > 0]
        selector: dict[str, str] = {}
        if pool.labels and any(
            all(n.get("Labels", {}).get(k) == v for k, v in pool.labels.items()) for n in members
        ):
            selector = dict(pool.labels)
        bundle = {res: float(demand)}
        gpus = 0.0
        if pool.kind == "gpu" and any(n.get("Resources", {}).get("GPU", 0) > 0 for n in members):
            gpus = float(demand)
            bundle["GPU"] = gpus
        return bundle, selector, gpus

    def _no_room(
        self,
        worker: str,
        role: str,
        demand: float,
        preferred: str,
        candidates: list[str],
        cap: dict[str, dict[str, float]],
        unavailable: dict[str, str],
        reason: str,
    ) -> str:
        lines = [f"cannot place worker {worker!r} (role {role}, {demand:g} slot(s)); "
                 f"preferred pool {preferred!r}: {reason}"]
        for c in candidates:
            c_cap = cap.get(c, {"total": 0.0, "free": 0.0})
            extra = f" - {unavailable[c]}" if c in unavailable else ""
            if c_cap["total"] == 0 and self._by_name[c].kind != "serverless":
                extra += f" - no alive node provides resource {pool_resource(c)}"
            lines.append(f"  pool {c!r}: {c_cap['free']:g} free of {c_cap['total']:g}{extra}")
        lines.append(
            "fix: add nodes to the pool (ray start --resources '{\"pool:<name>\": N}' "
            f"--labels ...), add a compatible pool to roles.{role}.fallback, or run fewer workers"
        )
        return "\n".join(lines)

    def annotate(self, worker_name: str, **fields: Any) -> Binding:
        """Add what is learnt after the actor starts (node_id, actor_id) to the record."""
        b = self._mine[worker_name]
        for k, v in fields.items():
            setattr(b, k, v)
        self.store.put(b)
        return b

    def release(self, worker_name: str) -> None:
        """Drop a worker's reservation and its record."""
        from ray.util.placement_group import PlacementGroup, remove_placement_group

        b = self._mine.pop(worker_name, None)
        if b is None:
            return
        if b.pg_id is not None:
            from ray._raylet import PlacementGroupID

            try:
                remove_placement_group(PlacementGroup(PlacementGroupID.from_hex(b.pg_id)))
            except Exception:  # noqa: BLE001 - already gone with its job
                pass
        self.store.delete(worker_name)

    def release_all(self) -> None:
        for name in list(self._mine):
            self.release(name)

    def bindings(self) -> list[Binding]:
        """All recorded bindings of this namespace (every process's, read from the GCS)."""
        return self.store.list()

    def _purge_stale(self) -> None:
        """Drop records of this namespace left by jobs that have ended (a crashed run)."""
        try:
            import ray._private.state as state

            dead = {
                j["JobID"] for j in state.jobs() if j.get("IsDead") or j.get("is_dead")
            }
        except Exception:  # noqa: BLE001 - best effort; records only inform
            return
        for b in self.store.list():
            if b.job_id and b.job_id in dead:
                self.store.delete(b.worker)


def _pg_node(pg: Any) -> str | None:
    from ray.util import placement_group_table

    try:
        return placement_group_table(pg)["bundles_to_node_id"].get(0)
    except Exception:  # noqa: BLE001 - node id is informative; the actor reports it later
        return None
