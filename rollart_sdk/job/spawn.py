"""The role workers of a run, started through a spawner (:mod:`rollart_sdk.cluster.spawn`:
Ray, or in-process) in placement priority: trainer ranks, engines per task pool (and the
prefill engines of prefill-decode disaggregation), reward, environments.

Nothing here checks the config: every check that could refuse the run ran before the
first worker started (:mod:`rollart_sdk.job.preflight`)."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rollart_sdk.cluster.handles import await_answer

if TYPE_CHECKING:
    from rollart_sdk.cluster.spawn import Spawner
    from rollart_sdk.config import ModelConfig, RunConfig
    from rollart_sdk.config.resolve import ResolvedRun
    from rollart_sdk.control.handles import WorkerHandle
    from rollart_sdk.resources.plan import ResourcePlan

# Times Ray restarts a dead engine worker's process (it then reloads the served weights
# before it serves again: control/recovery.py).
ENGINE_MAX_RESTARTS = 3
# Times Ray restarts a dead env worker's process. It holds no state a trajectory needs
# back: the calls in flight fail (their trajectories are re-run) and each env slot it
# hosted is replaced by a new instance on the restarted process.
ENV_MAX_RESTARTS = 8


@dataclass
class Workers:
    """The handles of a run's started workers, as the control plane is wired to them."""

    trainers: list[WorkerHandle]
    engines: list[WorkerHandle]
    routes: dict[str, list[str]]
    reward: WorkerHandle
    envs: dict[str, list[WorkerHandle]]  # task tag -> its env hosts (inline or workers)
    prefill: list[WorkerHandle]  # prefill-decode disaggregation: the prefill engines
    # PD: task tag -> its pool's prefill engines
    prefill_routes: dict[str, list[str]] = field(default_factory=dict)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the trainer ranks' process group)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def max_running(cfg: RunConfig) -> int:
    """Trajectories the scheduler may run at once: ``rollout.max_envs`` (default: one
    step's launches), in whole groups."""
    from rollart_sdk.control.pipeline import launches_per_step

    r = cfg.rollout
    running = r.max_envs or sum(launches_per_step(cfg).values())
    return max(r.group_size, (running // r.group_size) * r.group_size)


def spawn_workers(cfg: RunConfig, resolved: ResolvedRun, plan: ResourcePlan,
                  model: ModelConfig, spawner: Spawner,
                  described: dict[str, dict[str, Any]], threads: dict[str, Any],
                  trainer: bool = True, *, offer: dict[str, Any] | None = None,
                  env_host: type | None = None) -> Workers:
    """Bind in order of placement priority: the trainer gets its compute pool first, then
    the engines their task pools, then reward and environments take what fits.
    ``trainer`` False: no trainer (``rollart eval`` of the initial weights).
    ``offer``: what the trainer, engine and transport backends may take besides their
    kind's arguments (a simulated run's ``sim`` context: ``Descriptor.create``);
    ``env_host``: every task's envs on the environment role's workers of this class (a
    simulated run's virtual-time host) instead of each task's ``env_host``."""
    from rollart_sdk.cluster.roles import EngineWorker, TrainerWorker

    world = cfg.roles.actor_train.workers
    init_method = f"tcp://127.0.0.1:{free_port()}" if world > 1 else None
    trainers = spawner.cluster(
        TrainerWorker, "train",
        (resolved.trainer.descriptor, resolved.trainer.options, model,
         resolved.transport.descriptor, resolved.transport.options, init_method,
         threads["actor_train"], offer),
        num_workers=world, demand=plan.role("actor_train").demand,
    ) if trainer else []
    # ActorGen: roles.actor_gen.workers engines spread over the pools the tasks' generation
    # is bound to (the plan); the route table sends each task's requests to its pool's
    # engines, or to the recorded fallback when that pool had no room. A sync run in
    # process offers the engine the trainer's thread to compute on (``shares_compute``).
    engine_offer = offer
    if spawner.shared_compute is not None:
        engine_offer = {**(offer or {}), "compute_executor": spawner.shared_compute}
    elif (threads.get("actor_gen_burst") or 0) > (threads["actor_gen"] or 0):
        # a sync run whose engine computes on a thread of its own: every core for its
        # long steps (resources/threads.py)
        engine_offer = {**(offer or {}), "burst_threads": threads["actor_gen_burst"]}
    engines = spawner.cluster(
        EngineWorker, "gen",
        (resolved.engine.descriptor, resolved.engine.options, model,
         resolved.transport.descriptor, resolved.transport.options, threads["actor_gen"],
         engine_offer),
        workers_per_pool=plan.role("actor_gen").workers_per_pool,
        hw_affinity=plan.hw_affinity(),
        max_restarts=ENGINE_MAX_RESTARTS, demand=plan.role("actor_gen").demand,
    )
    routes = spawner.routes("gen", [t.tag for t in cfg.tasks])
    prefill = _spawn_prefill(cfg, resolved, plan, model, spawner, threads["actor_gen"], offer)
    prefill_routes: dict[str, list[str]] = {}
    if prefill:  # PD: every task decodes on the "gen" workers, prefills in its own pool
        routes = {tag: [e.name for e in engines] for tag in [*routes, "default"]}
        prefill_routes = spawner.routes("gen-prefill", [t.tag for t in cfg.tasks])
    reward = _reward_handle(resolved, spawner)
    envs = (_spawn_envs(cfg, resolved, spawner, described) if env_host is None
            else _spawn_env_hosts(cfg, resolved, spawner, env_host))
    spawner.ready()  # every role's workers started at once; wait for all of them
    for h in engines + prefill:  # fail fast, with the worker's own error
        await_answer(h.engine.version(), 600)
    for h in trainers:
        await_answer(h.trainer.version(), 600)
    return Workers(trainers, engines, routes, reward, envs, prefill, prefill_routes)


def _spawn_prefill(cfg: RunConfig, resolved: ResolvedRun, plan: ResourcePlan,
                   model: ModelConfig, spawner: Spawner, threads: int,
                   offer: dict[str, Any] | None = None) -> list[WorkerHandle]:
    """Prefill-decode disaggregation (``roles.actor_gen.prefill/decode``): the prefill
    engines, beside the decode ones (the "gen" cluster, sized by the plan's decode pool).
    That the engine can hand K/V over is preflight's ``check_prefill``."""
    from rollart_sdk.cluster.roles import EngineWorker

    if not cfg.roles.actor_gen.disaggregated:
        return []
    handles: list[WorkerHandle] = spawner.cluster(
        EngineWorker, "gen-prefill",
        (resolved.engine.descriptor, resolved.engine.options, model,
         resolved.transport.descriptor, resolved.transport.options, threads, offer),
        workers_per_pool=plan.role("actor_gen").prefill_per_pool,
        hw_affinity=plan.prefill_affinity(),
        max_restarts=ENGINE_MAX_RESTARTS, demand=plan.role("actor_gen").demand,
    )
    return handles


def _spawn_env_hosts(cfg: RunConfig, resolved: ResolvedRun, spawner: Spawner,
                     env_host: type) -> dict[str, list[WorkerHandle]]:
    """Every task's envs on the environment role's workers of class ``env_host``."""
    spec = {tag: (res.descriptor, res.options) for tag, res in resolved.envs.items()}
    hosts: list[WorkerHandle] = spawner.cluster(env_host, "env", (spec,),
                                                num_workers=cfg.roles.environment.workers)
    return {t.tag: hosts for t in cfg.tasks}


def _spawn_envs(cfg: RunConfig, resolved: ResolvedRun, spawner: Spawner,
                described: dict[str, dict[str, Any]]) -> dict[str, list[WorkerHandle]]:
    """Each task's env hosts (``tasks[].env_host``): cheap envs inline in this (the
    EnvManagers') process, waiting envs on its threads, the rest on the environment role's
    workers."""
    from rollart_sdk.cluster.inline_env import inline_handle, inline_tasks, thread_tasks
    from rollart_sdk.cluster.roles import EnvWorker

    inline = inline_tasks(cfg, described)
    threaded = thread_tasks(cfg)
    env_spec = {tag: (res.descriptor, res.options, cfg.task(tag).env.faults)
                for tag, res in resolved.envs.items()}
    hosts: dict[str, list[WorkerHandle]] = {}
    if inline:
        host = inline_handle({tag: env_spec[tag][:2] for tag in inline})
        hosts.update({tag: [host] for tag in inline})
    if threaded:
        host = inline_handle({tag: env_spec[tag][:2] for tag in threaded}, on_loop=False)
        hosts.update({tag: [host] for tag in threaded})
    remote = {tag: spec for tag, spec in env_spec.items()
              if tag not in inline and tag not in threaded}
    if remote:
        workers = spawner.cluster(EnvWorker, "env", (remote,),
                                  num_workers=cfg.roles.environment.workers,
                                  concurrency=max_running(cfg) + 8,
                                  max_restarts=ENV_MAX_RESTARTS)
        hosts.update({tag: workers for tag in remote})
    return hosts


def _reward_handle(resolved: ResolvedRun, spawner: Spawner) -> WorkerHandle:
    """Rewards whose registration declares resources (a judge model) get a reward worker on
    the reward role's pool; the rest (rule, serverless) run in this process (R3: a trivial
    reward pins no GPU). One handle serves both."""
    from rollart_sdk.cluster.roles import RewardBackendWorker, RewardRouter
    from rollart_sdk.control.handles import WorkerHandle

    spec = {tag: (res.descriptor, res.options) for tag, res in resolved.rewards.items()}
    remote = {tag: s for tag, s in spec.items() if s[0].resources}
    local = {tag: s for tag, s in spec.items() if not s[0].resources}
    worker = None
    if remote:
        (worker,) = spawner.cluster(RewardBackendWorker, "reward", (remote,), concurrency=64)
        if not local:
            return worker
    router = RewardRouter(local, worker)
    return WorkerHandle("reward@control", router,
                        pool="control", hardware="cpu", is_ray=False)
