"""The resource plan: which pool each role and each task prefers, checked before anything runs.

``plan_resources`` is pure (no Ray): ``rollart validate`` calls it so that a config naming a
pool that cannot host a role, a task affinity on a serverless endpoint, a serverless URL
with no transport, or more workers than the pools can hold is rejected with the key to fix,
not discovered mid-run.

Role defaults follow the paper (section 5.2), chosen by each pool's ``profile``:
ActorTrain -> compute pool, ActorGen -> bandwidth pool, Environment -> CPU pool,
Reward -> a local GPU pool (compute first). A role whose profiles no pool offers lands on
the first non-serverless pool, so the default single ``local`` pool hosts everything.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from rollart_sdk.config import PoolConfig, RunConfig
from rollart_sdk.errors import ConfigError

if TYPE_CHECKING:
    from rollart_sdk.config.resolve import ResolvedRun

ROLES: tuple[str, ...] = ("actor_train", "actor_gen", "environment", "reward")

# Profiles each role prefers, best first (paper section 5.2). Anything else is a fallback
# only when the config says so (roles.<role>.fallback).
ROLE_PROFILES: dict[str, tuple[str, ...]] = {
    "actor_train": ("compute", "bandwidth"),
    "actor_gen": ("bandwidth", "compute"),
    "environment": ("cpu",),
    "reward": ("compute", "bandwidth", "cpu"),
}

POOL_RESOURCE_PREFIX = "pool:"


def pool_resource(pool: str) -> str:
    """The Ray custom resource that stands for one slot of ``pool``."""
    return f"{POOL_RESOURCE_PREFIX}{pool}"


@dataclass
class RolePlan:
    """Where one role's workers go: a preferred pool, compatible fallbacks, worker counts."""

    role: str
    preferred: str
    fallbacks: list[str]
    workers: int
    workers_per_pool: dict[str, int]
    # actor_gen with prefill-decode disaggregation: the prefill workers (workers_per_pool
    # are then the decode workers).
    prefill_per_pool: dict[str, int] = field(default_factory=dict)
    # Devices (pool slots) each worker holds, and the config keys that ask for them
    # (resources/demand.py: the backend's options say it).
    demand: int = 1
    demand_source: str = ""

    @property
    def candidates(self) -> list[str]:
        """Preferred pool first, then the fallbacks in order."""
        return [self.preferred, *[p for p in self.fallbacks if p != self.preferred]]


@dataclass
class ResourcePlan:
    """Pools, role placements and task-to-pool routing for one run."""

    pools: list[PoolConfig]
    roles: dict[str, RolePlan]
    task_pools: dict[str, str] = field(default_factory=dict)  # task tag -> generation pool
    warnings: list[str] = field(default_factory=list)
    # Prefill-decode disaggregation: task tag -> the pool of its prefill workers (its
    # affinity, else roles.actor_gen.prefill.pool); empty without PD.
    prefill_pools: dict[str, str] = field(default_factory=dict)

    def pool(self, name: str) -> PoolConfig:
        for p in self.pools:
            if p.name == name:
                return p
        raise KeyError(f"no pool named {name!r}; pools: {', '.join(p.name for p in self.pools)}")

    def role(self, role: str) -> RolePlan:
        if role not in self.roles:
            raise KeyError(f"unknown role {role!r}; roles: {', '.join(self.roles)}")
        return self.roles[role]

    def hw_affinity(self) -> dict[str, str]:
        """``{tag: pool, "default": actor_gen pool}`` for ``Cluster(hw_affinity=...)``:
        the config's ``tasks[].affinity`` in the shape of the ``hw_mapping`` decorator."""
        out = dict(self.task_pools)
        out["default"] = self.roles["actor_gen"].preferred
        return out

    def prefill_affinity(self) -> dict[str, str]:
        """PD: ``{tag: its prefill pool, "default": the first prefill pool}``, the routing
        table of the prefill workers (a task's prompts go to its own pool's)."""
        pools = list(self.roles["actor_gen"].prefill_per_pool)
        return {**self.prefill_pools, "default": pools[0]} if pools else {}

    def local_node_resources(self) -> tuple[dict[str, float], dict[str, str]]:
        """Custom resources and labels that make one machine look like every pool.

        Each pool becomes ``pool:<name>`` with its slot count. Pool labels are merged where
        they agree; a key two pools set differently is left out (one node cannot carry
        both values), and the ResourceManager then places by the resource alone.
        """
        resources = {pool_resource(p.name): float(p.count) for p in self.pools}
        labels: dict[str, str] = {}
        clashing: set[str] = set()
        for p in self.pools:
            for k, v in p.labels.items():
                if k in labels and labels[k] != v:
                    clashing.add(k)
                labels.setdefault(k, v)
        for k in clashing:
            labels.pop(k, None)
        return resources, labels

    def check_worker_class(self, worker_cls: type, where: str | None = None) -> None:
        """Reject decorator misuse on a Worker class against these pools (ConfigError)."""
        from rollart_sdk.resources.decorators import check_worker_class

        check_worker_class(worker_cls, self.pools, where=where)

    def to_json(self) -> dict[str, Any]:
        return {
            "pools": [p.model_dump() for p in self.pools],
            "roles": {
                r.role: {
                    "preferred": r.preferred,
                    "fallbacks": r.fallbacks,
                    "workers": r.workers,
                    "workers_per_pool": r.workers_per_pool,
                    **({"prefill_per_pool": r.prefill_per_pool} if r.prefill_per_pool else {}),
                    **({"demand": r.demand} if r.demand != 1 else {}),
                }
                for r in self.roles.values()
            },
            "task_pools": self.task_pools,
            **({"prefill_pools": self.prefill_pools} if self.prefill_pools else {}),
            "warnings": self.warnings,
        }


def default_role_pools(pools: list[PoolConfig], role: str) -> list[str]:
    """Pools compatible with ``role`` by profile, best first (config order within a profile).

    When no pool has one of the role's profiles, every non-serverless pool qualifies, so a
    single CPU pool (the embedded default) hosts all roles.
    """
    out: list[str] = []
    for profile in ROLE_PROFILES[role]:
        out += [p.name for p in pools if p.profile == profile and p.kind != "serverless"]
    if not out:
        out = [p.name for p in pools if p.kind != "serverless"]
    return out


def role_plan_from_pools(
    pools: list[PoolConfig],
    role: str,
    pool: str | None = None,
    fallback: list[str] | None = None,
    workers: int = 1,
) -> RolePlan:
    """One role's plan from pools alone (no config): the paper defaults unless overridden."""
    compatible = default_role_pools(pools, role)
    preferred = pool or (compatible[0] if compatible else pools[0].name)
    fallbacks = list(fallback) if fallback is not None else [p for p in compatible if p != preferred]
    return RolePlan(role, preferred, fallbacks, workers, {preferred: workers})


def plan_resources(
    cfg: RunConfig,
    resolved: ResolvedRun | None = None,
    workers: Mapping[str, type] | None = None,
) -> ResourcePlan:
    """Resolve every role's and task's pool and reject misuse with the key to fix.

    ``workers`` (role -> Worker class) additionally checks the classes' decorators
    (``hw_mapping`` hardware, ``register_serverless`` URL schemes) against the pools;
    ``rollart validate`` and ``build_job`` pass the built-in role workers. ``resolved``
    (the chosen backends) sizes the reward role: only rewards whose registration declares
    resources (a judge model) take a reward worker; rule and serverless rewards run in the
    control plane's process and take no slot.
    """
    problems: list[tuple[str, str]] = []
    pools = list(cfg.pools)
    by_name = {p.name: p for p in pools}
    problems += _check_serverless_urls(pools)
    roles = _role_plans(cfg, pools, by_name, problems)
    if resolved is not None:
        _size_reward_role(cfg, resolved, pools, roles["reward"])
        problems += _apply_demands(cfg, resolved, roles)
    task_pools = _task_pools(cfg, roles["actor_gen"], by_name, problems)
    prefill_pools: dict[str, str] = {}  # PD: the prefill workers follow the affinities
    warnings = (_disaggregate(cfg, roles["actor_gen"], by_name, problems, prefill_pools)
                if cfg.roles.actor_gen.disaggregated
                else _spread_engines(roles["actor_gen"], task_pools))
    problems += _check_capacity(pools, roles, by_name)
    for role, cls in (workers or {}).items():
        from rollart_sdk.resources.decorators import check_worker_class

        try:
            check_worker_class(cls, pools, where=f"roles.{role}")
        except ConfigError as exc:
            problems.extend(exc.problems)
    if problems:
        raise ConfigError(problems)
    return ResourcePlan(pools=pools, roles=roles, task_pools=task_pools, warnings=warnings,
                        prefill_pools=prefill_pools)


def _check_serverless_urls(pools: list[PoolConfig]) -> list[tuple[str, str]]:
    from rollart_sdk.resources.decorators import known_schemes

    schemes = known_schemes()
    problems = []
    for i, p in enumerate(pools):
        if p.kind == "serverless" and p.url:
            scheme = urlparse(p.url).scheme
            if scheme not in schemes:
                problems.append(
                    (f"pools.{i}.url", f"no serverless caller for scheme {scheme!r} in "
                     f"{p.url!r}; known schemes: {', '.join(sorted(schemes))} (a plugin adds "
                     "one with the hook rollart_register_serverless_schemes)")
                )
    return problems


def _role_plans(cfg: RunConfig, pools: list[PoolConfig], by_name: dict[str, PoolConfig],
                problems: list[tuple[str, str]]) -> dict[str, RolePlan]:
    """Each role's pools; only reward may use a serverless pool."""
    roles: dict[str, RolePlan] = {}
    for role in ROLES:
        rc = getattr(cfg.roles, role)
        rp = role_plan_from_pools(pools, role, rc.pool, rc.fallback, rc.workers)
        pref = by_name.get(rp.preferred)
        if pref is not None and pref.kind == "serverless" and role != "reward":
            problems.append(
                (f"roles.{role}.pool", f"pool {pref.name!r} is a serverless endpoint; only the "
                 "reward role can run there (pick a gpu or cpu pool)")
            )
        for j, fb in enumerate(rp.fallbacks):
            fbp = by_name.get(fb)
            if fbp is not None and fbp.kind == "serverless" and role != "reward":
                problems.append(
                    (f"roles.{role}.fallback.{j}", f"pool {fb!r} is serverless; only reward can use it")
                )
        roles[role] = rp
    return roles


def _size_reward_role(cfg: RunConfig, resolved: ResolvedRun, pools: list[PoolConfig],
                      reward: RolePlan) -> None:
    """No reward worker unless a reward backend asks for resources; a backend that asks
    for no GPU prefers a CPU pool (unless roles.reward.pool names one)."""
    needs = [r.descriptor.resources for r in resolved.rewards.values() if r.descriptor.resources]
    if not needs:
        reward.workers, reward.workers_per_pool = 0, {}
        return
    if cfg.roles.reward.pool is None and not any(n.get("GPU") for n in needs):
        cpu = [p.name for p in pools if p.profile == "cpu" and p.kind != "serverless"]
        if cpu:
            reward.fallbacks = [p for p in reward.candidates if p != cpu[0]]
            reward.preferred = cpu[0]
            reward.workers_per_pool = {cpu[0]: reward.workers}


def _task_pools(cfg: RunConfig, gen: RolePlan, by_name: dict[str, PoolConfig],
                problems: list[tuple[str, str]]) -> dict[str, str]:
    """Generation pools: each task's affinity, else the actor_gen pool (hw_mapping in config)."""
    task_pools: dict[str, str] = {}
    for i, t in enumerate(cfg.tasks):
        target = t.affinity or gen.preferred
        tp = by_name.get(target)
        if tp is not None and tp.kind == "serverless":
            problems.append(
                (f"tasks.{i}.affinity", f"pool {target!r} is a serverless endpoint; generation "
                 "needs a gpu or cpu pool")
            )
        task_pools[t.tag] = target
    return task_pools


def _spread_engines(gen: RolePlan, task_pools: dict[str, str]) -> list[str]:
    """Spread ``actor_gen.workers`` over the generation pools (sets ``workers_per_pool``);
    warns when some pool gets none."""
    warnings: list[str] = []
    gen_pools = [gen.preferred] + [p for p in dict.fromkeys(task_pools.values()) if p != gen.preferred]
    per_pool = {p: 0 for p in gen_pools}
    for k in range(gen.workers):
        per_pool[gen_pools[k % len(gen_pools)]] += 1
    starved = [p for p, n in per_pool.items() if n == 0]
    if starved:
        tags = [t for t, p in task_pools.items() if p in starved]
        warnings.append(
            f"roles.actor_gen.workers={gen.workers} is fewer than the generation pools "
            f"({', '.join(gen_pools)}); tasks {', '.join(tags)} will use the fallback workers "
            "(raise roles.actor_gen.workers to give every pool one)"
        )
    gen.workers_per_pool = {p: n for p, n in per_pool.items() if n}
    return warnings


def _disaggregate(cfg: RunConfig, gen: RolePlan, by_name: dict[str, PoolConfig],
                  problems: list[tuple[str, str]], prefill_pools: dict[str, str]) -> list[str]:
    """Prefill-decode disaggregation (``roles.actor_gen.prefill/decode``): the decode
    workers replace the spread engines; the prefill workers are planned beside them,
    spread over ``roles.actor_gen.prefill.pool`` and the pools the tasks' affinities
    name (a task's prompts are computed in its own pool; fills ``prefill_pools``)."""
    g = cfg.roles.actor_gen
    if g.prefill is None or g.decode is None:
        return []
    for phase, pc in (("prefill", g.prefill), ("decode", g.decode)):
        if pc.pool is not None and pc.pool not in by_name:
            problems.append((f"roles.actor_gen.{phase}.pool",
                             f"unknown pool {pc.pool!r}; pools: {', '.join(by_name)}"))
    gen.workers_per_pool = {g.decode.pool or gen.preferred: g.decode.workers}
    home = g.prefill.pool or gen.preferred
    prefill_pools.update({t.tag: t.affinity or home for t in cfg.tasks})
    spread = [home, *[p for p in dict.fromkeys(prefill_pools.values()) if p != home]]
    per_pool = dict.fromkeys(spread, 0)
    for k in range(g.prefill.workers):
        per_pool[spread[k % len(spread)]] += 1
    gen.prefill_per_pool = {p: n for p, n in per_pool.items() if n}
    starved = [p for p, n in per_pool.items() if n == 0]
    if starved:
        tags = [t for t, p in prefill_pools.items() if p in starved]
        return [f"roles.actor_gen.prefill.workers={g.prefill.workers} is fewer than the "
                f"prefill pools ({', '.join(spread)}); the prompts of tasks "
                f"{', '.join(tags)} are computed in another pool (raise "
                "roles.actor_gen.prefill.workers to give every task's pool one)"]
    return []


def _apply_demands(cfg: RunConfig, resolved: ResolvedRun,
                   roles: dict[str, RolePlan]) -> list[tuple[str, str]]:
    """Each engine and trainer worker's device demand, as its backend's options say
    (resources/demand.py); a trainer world that is no multiple of its model-parallel
    size is a config error."""
    from rollart_sdk.resources.demand import demand_source, device_demand, workers_multiple

    problems: list[tuple[str, str]] = []
    for role, kind in (("actor_gen", "engine"), ("actor_train", "trainer")):
        res = getattr(resolved, kind, None)
        if res is None:  # a partial resolution (a caller that only sized rewards)
            continue
        rp = roles[role]
        rp.demand = device_demand(res.options)
        rp.demand_source = demand_source(res.options, kind)
        multiple = workers_multiple(res.options)
        workers = getattr(cfg.roles, role).workers
        if workers % multiple:
            problems.append(
                (f"roles.{role}.workers", f"{kind} {res.descriptor.name!r} runs {multiple} "
                 f"workers (one device each) per data-parallel rank ({rp.demand_source}); "
                 f"roles.{role}.workers={workers} is not a multiple of {multiple}: set it "
                 f"to {workers + multiple - workers % multiple}"
                 + (f" or {workers - workers % multiple}" if workers > multiple else "")
                 + f", or change {rp.demand_source}")
            )
    return problems


def _check_capacity(pools: list[PoolConfig], roles: dict[str, RolePlan],
                    by_name: dict[str, PoolConfig]) -> list[tuple[str, str]]:
    """Place every worker greedily (preferred first, then fallbacks), as the affinity
    policy would on an idle cluster, each taking its role's demand in devices; a worker
    that fits nowhere is a config error."""
    problems = []
    free = {p.name: float(p.count) for p in pools}
    for role in ROLES:
        rp = roles[role]
        for pool_name, n in [*rp.workers_per_pool.items(), *rp.prefill_per_pool.items()]:
            order = [pool_name, *[c for c in rp.candidates if c != pool_name]]
            for _ in range(n):
                spot = next((c for c in order if free.get(c, 0.0) >= rp.demand), None)
                if spot is None:
                    problems.append(_no_fit(rp, order, by_name, pools))
                    break
                free[spot] -= rp.demand
    return problems


def _no_fit(rp: RolePlan, order: list[str], by_name: dict[str, PoolConfig],
            pools: list[PoolConfig]) -> tuple[str, str]:
    """Why a worker of ``rp`` fits nowhere: no pool has its demand at all, or the role's
    workers do not fit next to the others."""
    role, d = rp.role, rp.demand
    index = {p.name: i for i, p in enumerate(pools)}
    caps = ", ".join(f"{c} ({by_name[c].count:g} slots)" for c in order if c in by_name)
    if d > 1 and not any(by_name[c].count >= d for c in order if c in by_name):
        counts = ", ".join(f"pools.{index[c]}.count={by_name[c].count:g} ({c})"
                           for c in order if c in by_name)
        return (f"roles.{role}.pool",
                f"one {role} worker needs {d} devices ({rp.demand_source}: one placement "
                f"bundle of {d} per worker) but the pools it may use have fewer: {counts}; "
                f"raise the pool's count to at least {d} (the devices it has), or lower "
                f"the parallel size ({rp.demand_source})")
    need = f" of {d} devices each" if d > 1 else ""
    return (f"roles.{role}.workers", f"{rp.workers} {role} workers{need} do not fit in "
            f"{caps} next to the other roles; raise pools[].count, add a pool to "
            f"roles.{role}.fallback, or lower roles.{role}.workers")


def pools_from_spec(spec: Any) -> list[PoolConfig]:
    """Pools from a ResourcePlan, a list of PoolConfig/dicts, or the paper's shorthand
    ``{"H800": 8, "H20": range(8, 32)}`` (name -> slot count or list of device ids)."""
    if isinstance(spec, ResourcePlan):
        return list(spec.pools)
    if isinstance(spec, Mapping):
        out = []
        for name, v in spec.items():
            if isinstance(v, PoolConfig):
                out.append(v)
            elif isinstance(v, Mapping):
                out.append(PoolConfig(name=name, **{"hardware": name, **v}))
            else:
                count = float(v) if isinstance(v, (int, float)) else float(len(list(v)))
                out.append(PoolConfig(name=name, hardware=name, count=count))
        return out
    return [p if isinstance(p, PoolConfig) else PoolConfig(**p) for p in spec]
