"""`rollart train`: assemble the installed plugins into ROLLART's pipeline and run it.

resource plan -> Ray (local on 127.0.0.1, or --address) -> bind every worker to its pool ->
spawn the role workers (env, reward, engines per task pool, trainer ranks) -> control
plane (LLMProxy, RolloutScheduler, SampleBuffer, Pipeline) -> run directory.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollart_sdk.config import RunConfig, load_config
from rollart_sdk.errors import RollartError


@dataclass
class Job:
    """Everything a started run holds; ``close()`` releases it."""

    config: RunConfig
    run_dir: Any
    pipeline: Any
    trainers: list[Any]
    spawner: Any

    def close(self) -> None:
        self.spawner.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _RaySpawner:
    """Builds each role's Cluster: workers bound to their pools by the ResourceManager and
    started there as Ray actors."""

    def __init__(self, cfg: RunConfig, plan: Any, policy: Any, namespace: str) -> None:
        import os

        from rollart_sdk.ray_utils import init_ray
        from rollart_sdk.resources.manager import ResourceManager

        resources, labels = plan.local_node_resources()
        init_ray(address=cfg.ray.address, num_cpus=cfg.ray.num_cpus or max(4, os.cpu_count() or 2),
                 resources=resources, labels=labels)
        self.plan = plan
        self.rm = ResourceManager(plan, policy=policy, namespace=namespace)
        self.clusters: dict[str, Any] = {}

    def cluster(self, cls: type, name: str, init_args: tuple[Any, ...],
                workers_per_pool: dict[str, int] | None = None, num_workers: int = 1,
                concurrency: int | None = None, hw_affinity: dict[str, str] | None = None,
                ) -> list[Any]:
        from rollart_sdk.cluster import Cluster
        from rollart_sdk.control.handles import WorkerHandle

        opts = {"max_concurrency": concurrency} if concurrency else None
        cl = Cluster(cls, cls.role, self.rm, num_workers=None if workers_per_pool else num_workers,
                     workers_per_pool=workers_per_pool, init_args=init_args, name=name,
                     hw_affinity=hw_affinity, actor_options=opts,
                     timeout_s=_start_timeout_s())
        self.clusters[name] = cl
        return [WorkerHandle(w.name, w.actor, pool=w.pool, hardware=w.hardware) for w in cl.workers]

    def routes(self, cluster: str, tags: list[str]) -> dict[str, list[str]]:
        cl = self.clusters[cluster]
        return {tag: [w.name for w in cl.workers_for_tag("generate", tag)] for tag in tags}

    def call(self, handle: Any, method: str, *args: Any, timeout: float = 600) -> Any:
        import ray

        return ray.get(getattr(handle.target, method).remote(*args), timeout=timeout)

    def bindings(self) -> list[dict[str, Any]]:
        return [b.to_json() for b in self.rm.bindings()]

    def close(self) -> None:
        for cl in self.clusters.values():
            try:
                cl.shutdown()
            except Exception:  # noqa: BLE001 - best effort at shutdown
                pass


class _LocalSpawner:
    """Every worker as an object in this process (tests, notebooks): the same worker classes
    and control plane, no Ray. Pools are recorded as planned; nothing is reserved."""

    def __init__(self, plan: Any) -> None:
        self.plan = plan
        self._bindings: list[dict[str, Any]] = []
        self._workers: dict[str, list[Any]] = {}

    def cluster(self, cls: type, name: str, init_args: tuple[Any, ...],
                workers_per_pool: dict[str, int] | None = None, num_workers: int = 1,
                concurrency: int | None = None, hw_affinity: dict[str, str] | None = None,
                ) -> list[Any]:
        from rollart_sdk.cluster.worker import WorkerContext, bound_worker_class
        from rollart_sdk.control.handles import WorkerHandle

        pools = ([p for p, n in workers_per_pool.items() for _ in range(n)] if workers_per_pool
                 else [self.plan.role(cls.role).preferred] * num_workers)
        handles = []
        for rank, pool in enumerate(pools):
            wname = f"{name}-{rank}"
            hw = self.plan.pool(pool).hardware
            binding = {"worker": wname, "role": cls.role, "pool": pool, "preferred": pool,
                       "hardware": hw}
            self._bindings.append(binding)
            ctx = WorkerContext(rank, len(pools), cls.role, name, wname, binding, {})
            obj = bound_worker_class(cls)(ctx, *init_args)
            handles.append(WorkerHandle(wname, obj, pool=pool, hardware=hw, is_ray=False))
        self._workers[name] = handles
        return handles

    def routes(self, cluster: str, tags: list[str]) -> dict[str, list[str]]:
        affinity = self.plan.hw_affinity()
        out = {}
        for tag in tags:
            target = affinity.get(tag, affinity["default"])
            handles = self._workers[cluster]
            out[tag] = [h.name for h in handles if target in (h.pool, h.hardware)] or [
                h.name for h in handles
            ]
        return out

    def call(self, handle: Any, method: str, *args: Any, timeout: float = 600) -> Any:
        result = getattr(handle.target, method)(*args)
        if asyncio.iscoroutine(result):
            result = asyncio.run(result)
        return result

    def bindings(self) -> list[dict[str, Any]]:
        return list(self._bindings)

    def close(self) -> None:
        pass


def describe_env(descriptor: Any, options: Any) -> dict[str, Any]:
    """Build one env in this process to read its action vocabulary and instructions."""
    env = descriptor.load()(**options.model_dump())
    try:
        return {
            "action_vocabulary": getattr(env, "action_vocabulary", None),
            "system_prompt": getattr(env, "system_prompt", None),
        }
    finally:
        close = getattr(env, "close", None)
        if callable(close):
            close()


def build_job(cfg: RunConfig, lines: Any = None, run_name: str | None = None,
              log: Any = print, in_process: bool = False, registry: Any = None) -> Job:
    """Bind and spawn every worker and wire the control plane.

    ``in_process=True`` runs every worker in this process (no Ray): the control plane and
    the backends are the same code; only placement and process boundaries are skipped.
    ``registry``: resolve backends there instead of the installed plugins (tests).
    """
    from rollart_sdk.cluster.roles import (
        EngineWorker,
        EnvWorker,
        RewardBackendWorker,
        TrainerWorker,
    )
    from rollart_sdk.control.buffer import SampleBuffer
    from rollart_sdk.control.chat import ChatFormat
    from rollart_sdk.control.env_manager import TaskRuntime
    from rollart_sdk.control.pipeline import Pipeline, launches_per_step, task_quota
    from rollart_sdk.control.proxy import LLMProxy
    from rollart_sdk.control.run_dir import RunDir
    from rollart_sdk.control.scheduler import RolloutScheduler
    from rollart_sdk.models import load_tokenizer, prepare_model
    from rollart_sdk.plugins import get_plugins
    from rollart_sdk.resolve import resolve_run
    from rollart_sdk.resources.plan import plan_resources

    resolved = resolve_run(cfg, registry or get_plugins().registry, lines)
    plan = plan_resources(cfg, resolved)
    run_dir = RunDir(cfg.output_dir, cfg, run_name)
    log(f"run directory: {run_dir.path}")
    for warning in plan.warnings:
        log(f"warning: {warning}")
    if in_process:
        spawner: Any = _LocalSpawner(plan)
    else:
        spawner = _RaySpawner(cfg, plan, resolved.placement.create(), run_dir.path.name)

    r = cfg.rollout
    launch = sum(launches_per_step(cfg).values())
    max_running = r.max_envs or launch
    max_running = max(r.group_size, (max_running // r.group_size) * r.group_size)

    # Static facts of each task's env (action vocabulary, instructions): the tiny model's
    # tokenizer needs the action words before any worker starts.
    described = {tag: describe_env(res.descriptor, res.options) for tag, res in resolved.envs.items()}
    extra_tokens = sorted({w for d in described.values() for w in (d["action_vocabulary"] or [])})
    model = prepare_model(cfg.model, Path(cfg.output_dir) / ".models", extra_tokens)
    log(f"model: {model.path}")

    # Bind in order of placement priority: the trainer gets its compute pool first, then
    # the engines their task pools, then reward and environments take what fits.
    world = cfg.roles.actor_train.workers
    init_method = f"tcp://127.0.0.1:{_free_port()}" if world > 1 else None
    trainers = spawner.cluster(
        TrainerWorker, "train",
        (resolved.trainer.descriptor, resolved.trainer.options, model,
         resolved.transport.descriptor, resolved.transport.options, init_method),
        num_workers=world,
    )
    # ActorGen: roles.actor_gen.workers engines spread over the pools the tasks' generation
    # is bound to (the plan); hw_mapping routes each task's requests to its pool's engines,
    # or to the recorded fallback when that pool had no room.
    engines = spawner.cluster(
        EngineWorker, "gen",
        (resolved.engine.descriptor, resolved.engine.options, model,
         resolved.transport.descriptor, resolved.transport.options),
        workers_per_pool=plan.role("actor_gen").workers_per_pool,
        hw_affinity=plan.hw_affinity(),
    )
    routes = spawner.routes("gen", [t.tag for t in cfg.tasks])
    routes["default"] = [e.name for e in engines]
    reward_spec = {tag: (res.descriptor, res.options) for tag, res in resolved.rewards.items()}
    (reward_worker,) = spawner.cluster(RewardBackendWorker, "reward", (reward_spec,),
                                       concurrency=64)
    env_spec = {tag: (res.descriptor, res.options) for tag, res in resolved.envs.items()}
    env_workers = spawner.cluster(EnvWorker, "env", (env_spec,),
                                  num_workers=cfg.roles.environment.workers,
                                  concurrency=max_running + 8)
    for h in engines + trainers:  # fail fast, with the worker's own error
        spawner.call(h, "version")

    chat = ChatFormat(load_tokenizer(model.path))
    tasks: dict[str, TaskRuntime] = {}
    for task in cfg.tasks:
        d = described[task.tag]
        allowed = None
        if task.constrain_actions:
            if not d["action_vocabulary"]:
                raise RollartError(
                    f"task {task.tag!r}: constrain_actions is set but env "
                    f"{task.env.name!r} has no action_vocabulary; set constrain_actions: false"
                )
            allowed = chat.action_token_ids(d["action_vocabulary"])
        system = d["system_prompt"] if task.system_prompt == "env" else task.system_prompt
        tasks[task.tag] = TaskRuntime(task, system or None, allowed)

    buffer = SampleBuffer(r.group_size)
    proxy = LLMProxy(engines, routes)
    holder: dict[str, Any] = {}
    scheduler = RolloutScheduler(
        tasks, chat, proxy, env_workers, reward_worker, buffer,
        version=lambda: holder["pipeline"].engine_version, group_size=r.group_size,
        max_running=max_running,
        alpha=r.effective_alpha if r.mode == "async" else None, batch_quota=task_quota(cfg),
        seed=cfg.seed, event_sink=run_dir.log_event, interaction=r.interaction,
        env_pools=env_pool_sizes(cfg, max_running),
    )
    pipeline = Pipeline(cfg, proxy, scheduler, buffer, trainers,
                        checkpoint_dir=str(run_dir.checkpoints), event_sink=run_dir.log_event)
    holder["pipeline"] = pipeline  # trajectories are stamped with the version engines serve
    run_dir.write_json("plan.json", plan.to_json())
    run_dir.write_json("bindings.json", spawner.bindings())
    return Job(cfg, run_dir, pipeline, trainers, spawner)


def env_pool_sizes(cfg: RunConfig, max_running: int) -> dict[str, int]:
    """Pooled environments per task: ``tasks[].env_pool``, by default as many as the run
    keeps busy at once (built lazily, so only the ones a task needs are made)."""
    sizes = {}
    for i, task in enumerate(cfg.tasks):
        size = max_running if task.env_pool is None else task.env_pool
        if size == 0:
            continue  # no pool: one environment per trajectory
        if size < cfg.rollout.group_size:
            from rollart_sdk.errors import ConfigError

            raise ConfigError([(f"tasks.{i}.env_pool", f"{size} environments cannot run a group "
                                f"of {cfg.rollout.group_size}; use at least "
                                f"rollout.group_size, or 0 for one environment per trajectory")])
        sizes[task.tag] = size
    return sizes


def env_summary(job: Job) -> dict[str, Any]:
    """Per task: pool size, slots used, episodes, failures; per worker: instances built."""
    sched = job.pipeline.scheduler
    pools = {tag: {"size": len(p.slots), "slots_used": sum(1 for s in p.slots if s.episodes),
                   "episodes": sum(s.episodes for s in p.slots), "failures": p.failures}
             for tag, p in sched.pools.items()}
    built: dict[str, int] = {}
    for w in sched.env_workers:
        try:
            stats = job.spawner.call(w, "stats", timeout=30)
        except Exception as exc:  # noqa: BLE001 - a dead env worker: say so in the summary
            built[f"error:{w.name}"] = 0
            pools.setdefault("_errors", {})[w.name] = f"{type(exc).__name__}: {exc}"
            continue
        for tag, n in stats["constructions"].items():
            built[tag] = built.get(tag, 0) + n
    return {"pools": pools, "constructions": built}


def run_job(job: Job, steps: int, progress: bool = True) -> list[Any]:
    """Run the pipeline with a live display; a final checkpoint even on Ctrl-C."""
    from rollart_sdk.control.pipeline import run_rollout_summary
    from rollart_sdk.control.progress import ProgressDisplay

    display = ProgressDisplay(job.config, steps, enabled=progress)

    def on_step(rec: Any, metrics: dict[str, Any]) -> None:
        job.run_dir.log_metrics(metrics)
        display.update(metrics)

    job.pipeline.on_step = on_step
    interrupted = False

    async def main() -> None:
        # Blocking calls of in-process workers (env steps, engine steps) run on the loop's
        # default executor: give it room for every concurrent environment.
        from concurrent.futures import ThreadPoolExecutor

        asyncio.get_running_loop().set_default_executor(
            ThreadPoolExecutor(max_workers=job.pipeline.scheduler.max_running + 16)
        )
        await job.pipeline.run(steps)

    error: Exception | None = None
    with display:
        try:
            asyncio.run(main())
        except KeyboardInterrupt:
            interrupted = True
        except Exception as exc:  # noqa: BLE001 - re-raised after the final checkpoint
            error = exc
    # Whatever ended the run (done, Ctrl-C, a failed weight sync), keep what was trained.
    # Every trainer rank takes part (collective for a tensor-parallel trainer).
    def all_trainers(method: str, path: Path) -> None:
        asyncio.run(asyncio.wait_for(job.pipeline.all_trainers(method, str(path)), 600))

    all_trainers("save_checkpoint", job.run_dir.checkpoints / "final")
    if job.config.train.save_final_model:
        all_trainers("save_pretrained", job.run_dir.path / "final_model")
    p = job.pipeline
    summary = {
        "steps": len(p.records),
        "interrupted": interrupted,
        "error": f"{type(error).__name__}: {error}" if error else None,
        "trajectories_trained": p.buffer.trained,
        "dropped": dict(p.buffer.dropped),
        "launched": p.scheduler.launched,
        "rollout": run_rollout_summary(p),
        "served": {f"{tag}@{w}": n for (tag, w), n in p.proxy.served.items()},
        "weight_updates": [vars(r) for r in p.update_reports],
        "wall_time_s": time.time() - p.started,
        "envs": env_summary(job),
        "learning": learning_summary(p),
    }
    job.run_dir.write_json("summary.json", summary)
    job.run_dir.close()
    if interrupted:
        raise KeyboardInterrupt
    if error is not None:
        raise error
    return p.records


def learning_summary(pipeline: Any) -> dict[str, dict[str, float]]:
    """Per task: reward (and success rate) of the first step and the mean over the last
    tenth of the steps - the figures docs/quickstart.md reports."""
    recs = pipeline.records
    if not recs:
        return {}
    k = max(1, len(recs) // 10)
    out: dict[str, dict[str, float]] = {}
    for tag in [t.tag for t in pipeline.cfg.tasks]:
        def mean(rs: list[Any], key: str, tag: str = tag) -> float | None:
            vals = []
            for r in rs:
                trajs = [t for t in r.batch if t.tag == tag]
                if key == "success":
                    trajs = [t for t in trajs if "success" in t.info]
                    vals += [1.0 if t.info["success"] else 0.0 for t in trajs]
                else:
                    vals += [t.reward or 0.0 for t in trajs]
            return sum(vals) / len(vals) if vals else None

        out[tag] = {
            "reward_first_step": mean(recs[:1], "reward"),
            "reward_last_tenth": mean(recs[-k:], "reward"),
            "success_first_step": mean(recs[:1], "success"),
            "success_last_tenth": mean(recs[-k:], "success"),
        }
    return out


def cmd_train(args: argparse.Namespace) -> int:
    from rollart_sdk.ray_utils import local_ray_env

    local_ray_env()
    if args.address:
        os.environ["RAY_ADDRESS"] = args.address
    from rollart_sdk.errors import ConfigError

    cfg, lines = load_config(args.config, args.overrides)
    try:
        job = build_job(cfg, lines)
    except ConfigError as exc:
        raise ConfigError(exc.problems, source=args.config) from None
    try:
        run_job(job, args.steps or cfg.train.steps, progress=not args.no_progress)
    except KeyboardInterrupt:
        print(f"interrupted; final checkpoint in {job.run_dir.checkpoints / 'final'}")
        return 130
    finally:
        job.close()
    import json

    summary = json.loads((job.run_dir.path / "summary.json").read_text())
    for tag, v in summary["learning"].items():
        key = "success" if v["success_last_tenth"] is not None else "reward"
        first, last = v[f"{key}_first_step"], v[f"{key}_last_tenth"]
        print(f"{tag}: {key} {first:.2f} at the first step -> {last:.2f} over the last tenth")
    ro = summary["rollout"]
    bias = ", ".join(f"{tag} {b:.2f}" for tag, b in ro["length_bias"].items())
    print(f"rollout: {ro['launched']} launched, {ro['trained']} trained; waste "
          f"{ro['waste']:.0%} of trajectories, {ro['waste_tokens']:.0%} of generated tokens; "
          f"{ro['spanning_update']} trained across a weight update; length bias {bias}")
    print(f"done: {job.run_dir.path}")
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("train", help="run the pipeline (starts Ray locally unless --address)")
    p.add_argument("config")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. rollout.alpha=2")
    p.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS or local)")
    p.add_argument("--steps", type=int, help="override train.steps")
    p.add_argument("--no-progress", action="store_true", help="plain log lines only")
    p.set_defaults(func=cmd_train)


def _start_timeout_s() -> float:
    """How long a cluster's workers may take to start (a vLLM engine on a busy CPU machine
    can take minutes); ROLLART_WORKER_START_TIMEOUT_S overrides the default 300 s."""
    import os

    return float(os.environ.get("ROLLART_WORKER_START_TIMEOUT_S", "300"))
