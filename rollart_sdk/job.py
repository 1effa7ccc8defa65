"""A job: the installed plugins assembled into ROLLART's pipeline, then run.

``build_job``: resolve every backend -> resource plan -> run directory -> spawn the role
workers in placement priority (trainer ranks, engines per task pool, reward, envs) through a
spawner (:mod:`rollart_sdk.cluster.spawn`: Ray, or in-process) -> the control plane
(LLMProxy, RolloutScheduler, SampleBuffer, WeightSync, Pipeline).
``run_job``: run the pipeline; a final checkpoint and ``summary.json`` whatever ends it.
The command line is ``rollart train`` (:mod:`rollart_sdk.cli.train`).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollart_sdk.config import ModelConfig, RunConfig
from rollart_sdk.errors import RollartError

if TYPE_CHECKING:
    from collections.abc import Callable

    from rollart_sdk.cluster.spawn import Spawner
    from rollart_sdk.config import LineMap
    from rollart_sdk.control.chat import ChatFormat
    from rollart_sdk.control.env_manager import TaskRuntime
    from rollart_sdk.control.handles import WorkerHandle
    from rollart_sdk.control.pipeline import Pipeline, StepRecord
    from rollart_sdk.control.run_dir import RunDir
    from rollart_sdk.control.sinks import SinkSet
    from rollart_sdk.layout import Layout
    from rollart_sdk.registry import Registry
    from rollart_sdk.resolve import ResolvedRun
    from rollart_sdk.resources.plan import ResourcePlan


@dataclass
class Job:
    """Everything a started run holds; ``close()`` releases it."""

    config: RunConfig
    run_dir: RunDir
    pipeline: Pipeline
    trainers: list[WorkerHandle]
    spawner: Spawner
    signal: str | None = None  # SIGINT / SIGTERM that stopped the run
    resume: ResumePoint | None = None  # --resume: where this session continues from
    restored: bool = False  # --resume: a checkpoint was loaded (until then nothing is written)
    sinks: SinkSet | None = None  # the metric sinks of ``logging:`` (control/sinks.py)
    layout: Layout | None = None  # where the workers run and why (rollart_sdk/layout.py)

    def close(self) -> None:
        if self.sinks is not None:
            self.sinks.close()
        self.spawner.close()


@dataclass
class ResumePoint:
    """``rollart train --resume RUN_DIR``: the run directory, the checkpoint to load (the
    newest that passed verification) and the control plane's state saved with it
    (control/resume.py); the complete checkpoints older than it (tried in turn should the
    trainer fail to load it) and the newer ones skipped, each with why."""

    run_dir: Path
    checkpoint: Path
    state: dict[str, Any]
    changed: list[str]  # config keys that differ from the run's (all allowed ones)
    older: list[Any] = field(default_factory=list)  # control.checkpoints.Checkpoint
    skipped: list[str] = field(default_factory=list)  # "step-N: why", newest first

    @classmethod
    def prepare(cls, cfg: RunConfig, run_dir: str | Path, steps: int) -> ResumePoint:
        """Check the run directory, its checkpoints and the config, before anything
        starts (and before anything is written)."""
        from rollart_sdk.control import checkpoints
        from rollart_sdk.control.resume import check_config, check_run_dir, find_loadable

        path, _ = check_run_dir(run_dir)
        changed = check_config(cfg, path)
        found = checkpoints.complete(path / "checkpoints")
        skipped: list[str] = []
        picked = find_loadable(found, skipped)
        if picked is None:
            raise RollartError(
                f"--resume {run_dir}: no checkpoint passed verification ("
                + "; ".join(skipped) + "); nothing was changed; start the run again "
                "without --resume")
        ckpt, state = picked
        if state["step"] >= steps:
            raise RollartError(
                f"--resume {run_dir}: {ckpt.name} has {state['step']} steps done, and the run "
                f"stops at {steps}; to train further, raise the step count (e.g. "
                f"train.steps={state['step'] + steps} or --steps {state['step'] + steps})")
        older = found[found.index(ckpt) + 1:]
        return cls(path, ckpt.path, state, changed, older, skipped)


@dataclass
class _Workers:
    trainers: list[WorkerHandle]
    engines: list[WorkerHandle]
    routes: dict[str, list[str]]
    reward: WorkerHandle
    envs: dict[str, list[WorkerHandle]]  # task tag -> its env hosts (inline or workers)
    prefill: list[WorkerHandle]  # prefill-decode disaggregation: the prefill engines


# Times Ray restarts a dead engine worker's process (it then reloads the served weights
# before it serves again: control/recovery.py).
ENGINE_MAX_RESTARTS = 3
# Times Ray restarts a dead env worker's process. It holds no state a trajectory needs
# back: the calls in flight fail (their trajectories are re-run) and each env slot it
# hosted is replaced by a new instance on the restarted process.
ENV_MAX_RESTARTS = 8


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def build_job(cfg: RunConfig, lines: LineMap | None = None, run_name: str | None = None,
              log: Any = print, in_process: bool = False, registry: Registry | None = None,
              resume: ResumePoint | None = None, layout: Layout | None = None) -> Job:
    """Bind and spawn every worker and wire the control plane.

    ``in_process=True`` runs every worker in this process (no Ray): the control plane and
    the backends are the same code; only placement and process boundaries are skipped,
    and the ``ray`` transport is replaced by ``local`` (rollart_sdk/layout.py).
    ``layout``: the layout chosen for the run (``rollart train``); it sets ``in_process``
    and is recorded in ``plan.json`` and ``summary.json``.
    ``registry``: resolve backends there instead of the installed plugins (tests).
    ``resume``: continue that run (its directory; ``run_job`` loads the checkpoint).
    """
    from rollart_sdk.cluster.roles import ROLE_WORKERS
    from rollart_sdk.cluster.spawn import LocalSpawner, RaySpawner
    from rollart_sdk.control.run_dir import RunDir
    from rollart_sdk.layout import inprocess_config
    from rollart_sdk.plugins import get_plugins
    from rollart_sdk.preflight import preflight
    from rollart_sdk.resolve import resolve_run
    from rollart_sdk.resources.plan import plan_resources

    if layout is not None:
        in_process = layout.in_process
    resolved = resolve_run(inprocess_config(cfg) if in_process else cfg,
                           registry or get_plugins().registry, lines, in_process=in_process)
    plan = plan_resources(cfg, resolved, workers=ROLE_WORKERS)
    # Before any worker starts (and before the run directory exists): output dir, model,
    # each task's context budget. The env facts (action words) shape a tiny tokenizer.
    checked = preflight(cfg, resolved, lines, log, output_dir=resume is None)
    described, model, tokenizer = checked["described"], checked["model"], checked["tokenizer"]
    log(f"model: {model.path}")
    if resume is not None:
        for line in resume.skipped:
            log(f"checkpoint {line}: skipped")
        log(f"resuming from {resume.checkpoint} ({resume.state['step']} steps done)"
            + (f"; changed: {', '.join(resume.changed)}" if resume.changed else ""))
    run_dir = RunDir(cfg.output_dir, cfg, run_name,
                     resume=resume.run_dir if resume is not None else None)
    log(f"run directory: {run_dir.path}")
    for warning in plan.warnings:
        log(f"warning: {warning}")
    from rollart_sdk.resources.threads import thread_plan

    # Threads per role (processes share the cores without oversubscription). In one
    # process torch has one global figure: ROLLART_TORCH_THREADS, else 1 (the plan's
    # "process" figure is recorded, not applied: tests rely on one thread there).
    threads: dict[str, Any] = thread_plan(cfg)
    if in_process:
        threads.update(actor_gen=None, actor_train=None)
    spawner: Spawner | None = None
    try:
        spawner = (LocalSpawner(plan) if in_process else
                   RaySpawner(cfg, plan, resolved.placement.create(), run_dir.path.name))
        workers = _spawn_workers(cfg, resolved, plan, model, spawner, described, threads)
    except BaseException:
        if spawner is not None:
            spawner.close()  # the workers already started (all clusters start at once)
        _abandon(run_dir, resumed=resume is not None)
        raise
    tasks = _task_runtimes(cfg, described, tokenizer)
    chat = tasks[cfg.tasks[0].tag].prompt_format  # the scheduler's default format
    pipeline = _wire_control_plane(cfg, workers, tasks, chat, run_dir)

    def rebind(worker: str) -> None:  # a restarted engine: its record counts the restart
        spawner.rebind(worker)
        run_dir.write_json("bindings.json", spawner.bindings())

    pipeline.recovery.rebind = rebind
    pipeline.say = log
    run_dir.write_json("plan.json", {**plan.to_json(), "threads": threads,
                                     **({"layout": layout.to_json()} if layout else {})})
    run_dir.write_json("bindings.json", spawner.bindings())
    return Job(cfg, run_dir, pipeline, workers.trainers, spawner, resume=resume, layout=layout,
               sinks=_start_sinks(cfg, resolved, run_dir, log))


def _start_sinks(cfg: RunConfig, resolved: ResolvedRun, run_dir: RunDir, log: Any) -> SinkSet:
    """The metric sinks of ``logging:``, started with the run's config (control/sinks.py)."""
    from rollart_sdk.control.sinks import SinkSet

    sinks = SinkSet.start(resolved.sinks, str(run_dir.path), run_dir.path.name,
                          cfg.model_dump(mode="json"), warn=lambda m: log(f"warning: {m}"))
    if sinks.sinks:
        log(f"metric sinks: {', '.join(s.name for s in sinks.sinks)}")
    return sinks


def _max_running(cfg: RunConfig) -> int:
    """Trajectories the scheduler may run at once: ``rollout.max_envs`` (default: one
    step's launches), in whole groups."""
    from rollart_sdk.control.pipeline import launches_per_step

    r = cfg.rollout
    max_running = r.max_envs or sum(launches_per_step(cfg).values())
    return max(r.group_size, (max_running // r.group_size) * r.group_size)


def _abandon(run_dir: RunDir, resumed: bool) -> None:
    """A run whose workers could not be started (no node provides a pool, a backend
    failed to construct) trained nothing: its new run directory is removed, so that
    output_dir is not littered with empty runs. A resumed run's directory is kept as is
    (its logs were only opened for appending)."""
    run_dir.close()
    if not resumed:
        shutil.rmtree(run_dir.path, ignore_errors=True)


def _spawn_workers(cfg: RunConfig, resolved: ResolvedRun, plan: ResourcePlan,
                   model: ModelConfig, spawner: Spawner,
                   described: dict[str, dict[str, Any]], threads: dict[str, int],
                   trainer: bool = True) -> _Workers:
    """Bind in order of placement priority: the trainer gets its compute pool first, then
    the engines their task pools, then reward and environments take what fits.
    ``trainer`` False: no trainer (``rollart eval`` of the initial weights)."""
    from rollart_sdk.cluster.roles import EngineWorker, TrainerWorker

    world = cfg.roles.actor_train.workers
    init_method = f"tcp://127.0.0.1:{_free_port()}" if world > 1 else None
    trainers = spawner.cluster(
        TrainerWorker, "train",
        (resolved.trainer.descriptor, resolved.trainer.options, model,
         resolved.transport.descriptor, resolved.transport.options, init_method,
         threads["actor_train"]),
        num_workers=world, demand=plan.role("actor_train").demand,
    ) if trainer else []
    # ActorGen: roles.actor_gen.workers engines spread over the pools the tasks' generation
    # is bound to (the plan); the route table sends each task's requests to its pool's
    # engines, or to the recorded fallback when that pool had no room.
    engines = spawner.cluster(
        EngineWorker, "gen",
        (resolved.engine.descriptor, resolved.engine.options, model,
         resolved.transport.descriptor, resolved.transport.options, threads["actor_gen"]),
        workers_per_pool=plan.role("actor_gen").workers_per_pool,
        hw_affinity=plan.hw_affinity(),
        max_restarts=ENGINE_MAX_RESTARTS, demand=plan.role("actor_gen").demand,
    )
    routes = spawner.routes("gen", [t.tag for t in cfg.tasks])
    prefill = _spawn_prefill(cfg, resolved, plan, model, spawner, threads["actor_gen"])
    if prefill:  # PD: every task's requests decode on the "gen" workers
        routes = {tag: [e.name for e in engines] for tag in [*routes, "default"]}
    reward = _reward_handle(resolved, spawner)
    envs = _spawn_envs(cfg, resolved, spawner, described)
    spawner.ready()  # every role's workers started at once; wait for all of them
    for h in engines + prefill + trainers:  # fail fast, with the worker's own error
        spawner.call(h, "version")
    return _Workers(trainers, engines, routes, reward, envs, prefill)


def _spawn_prefill(cfg: RunConfig, resolved: ResolvedRun, plan: ResourcePlan,
                   model: ModelConfig, spawner: Spawner, threads: int) -> list[WorkerHandle]:
    """Prefill-decode disaggregation (``roles.actor_gen.prefill/decode``): the prefill
    engines, beside the decode ones (the "gen" cluster, sized by the plan's decode pool)."""
    from rollart_sdk.cluster.roles import EngineWorker
    from rollart_sdk.errors import ConfigError

    if not cfg.roles.actor_gen.disaggregated:
        return []
    if not hasattr(resolved.engine.descriptor.load(), "prefill_kv"):
        raise ConfigError([("roles.actor_gen.prefill", f"engine {cfg.engine.name!r} cannot "
                            "hand K/V over (it has no prefill_kv); use engine torch, or drop "
                            "roles.actor_gen.prefill/decode")])
    handles: list[WorkerHandle] = spawner.cluster(
        EngineWorker, "gen-prefill",
        (resolved.engine.descriptor, resolved.engine.options, model,
         resolved.transport.descriptor, resolved.transport.options, threads),
        workers_per_pool=plan.role("actor_gen").prefill_per_pool,
        max_restarts=ENGINE_MAX_RESTARTS, demand=plan.role("actor_gen").demand,
    )
    return handles


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
                                  concurrency=_max_running(cfg) + 8,
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


def _task_runtimes(cfg: RunConfig, described: dict[str, dict[str, Any]],
                   tokenizer: Any) -> dict[str, TaskRuntime]:
    """Each task's prompt format (chat template or plain text), system prompt and allowed
    action tokens."""
    from rollart_sdk.control.chat import task_prompt_format
    from rollart_sdk.control.env_manager import TaskRuntime
    from rollart_sdk.errors import ConfigError

    tasks: dict[str, TaskRuntime] = {}
    gateway = None
    if any(described[t.tag].get("agent") for t in cfg.tasks):
        from rollart_sdk.gateway import Gateway

        gateway = Gateway()  # one per run, started on the control plane's loop
    for i, task in enumerate(cfg.tasks):
        d = described[task.tag]
        system = d["system_prompt"] if task.system_prompt == "env" else task.system_prompt
        try:  # preflight built it already: this fails only where it was not run
            fmt = task_prompt_format(tokenizer, task, system or None)
        except ValueError as exc:
            raise ConfigError([(f"tasks.{i}.prompt_format", str(exc))]) from None
        allowed = None
        if task.constrain_actions:
            if not d["action_vocabulary"]:
                raise RollartError(
                    f"task {task.tag!r}: constrain_actions is set but env "
                    f"{task.env.name!r} has no action_vocabulary; set constrain_actions: false"
                )
            allowed = fmt.action_token_ids(d["action_vocabulary"])
        tasks[task.tag] = TaskRuntime(task, system or None, allowed, fmt)
        if d.get("agent"):
            tasks[task.tag].gateway = gateway
            tasks[task.tag].tool_parser = d["tool_parser"]
    return tasks


def _wire_control_plane(cfg: RunConfig, workers: _Workers, tasks: dict[str, TaskRuntime],
                        chat: ChatFormat, run_dir: RunDir) -> Pipeline:
    from rollart_sdk.control.buffer import SampleBuffer
    from rollart_sdk.control.pipeline import Pipeline, task_quota
    from rollart_sdk.control.proxy import LLMProxy
    from rollart_sdk.control.scheduler import RolloutScheduler
    from rollart_sdk.control.versions import PolicyVersions
    from rollart_sdk.weights import WeightSync

    r = cfg.rollout
    buffer = SampleBuffer(r.group_size, r.filter_zero_variance, r.filter_cap)
    proxy = LLMProxy(workers.engines, workers.routes, prefill_workers=workers.prefill)
    # Trajectories are stamped with the version the engines serve.
    versions = PolicyVersions()
    scheduler = RolloutScheduler(
        tasks, chat, proxy, workers.envs, workers.reward, buffer,
        version=versions.serving, group_size=r.group_size,
        max_running=_max_running(cfg),
        alpha=r.effective_alpha if r.mode == "async" else None, batch_quota=task_quota(cfg),
        seed=cfg.seed, event_sink=run_dir.log_event, interaction=r.interaction,
        env_pools=env_pool_sizes(cfg, _max_running(cfg)),
        max_member_retries=cfg.rollout.max_member_retries,
        admission_version=versions.admission_base,
    )
    pipeline = Pipeline(cfg, proxy, scheduler, buffer, workers.trainers,
                        checkpoint_dir=str(run_dir.checkpoints), event_sink=run_dir.log_event,
                        weight_sync=WeightSync(workers.engines + workers.prefill), versions=versions)
    scheduler.on_finish.append(run_dir.log_finished)  # env close errors
    buffer.on_drop.append(run_dir.log_drop)  # drops.jsonl: every trajectory counted dropped
    buffer.on_side_error = scheduler.side_error
    if cfg.eval is not None and cfg.eval.every_steps:
        from rollart_sdk.control.evaluation import Evaluator

        # The same proxy (engines), env hosts and reward handle as training; episodes
        # that no buffer or trainer ever sees (control/evaluation.py).
        pipeline.evaluator = Evaluator.build(cfg, cfg.eval, tasks, chat, proxy, workers.envs,
                                             workers.reward, versions.serving)
    return pipeline


def newest_checkpoint(root: Path) -> str | None:
    """The newest complete checkpoint under ``root`` (``RUN/checkpoints``): the one
    ``--resume`` would try first."""
    from rollart_sdk.control import checkpoints

    found = checkpoints.complete(root)
    return str(found[0].path) if found else None


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
    """Per task: pool size, slots used, episodes, failures; per worker: instances built;
    per thread host (env_host: thread): its hung, timed-out and refused calls."""
    sched = job.pipeline.scheduler
    pools: dict[str, Any] = {
        tag: {"size": len(p.slots), "slots_used": sum(1 for s in p.slots if s.episodes),
              "episodes": sum(s.episodes for s in p.slots), "failures": p.failures}
        for tag, p in sched.pools.items()}
    built: dict[str, int] = {}
    threads: dict[str, Any] = {}
    for w in sched.env_workers:
        try:
            # an in-process host (env_host inline or thread) whatever the spawner
            stats = (job.spawner.call(w, "stats", timeout=30) if w.is_ray
                     else w.target.stats())
        except Exception as exc:  # noqa: BLE001 - a dead env worker: say so in the summary
            built[f"error:{w.name}"] = 0
            pools.setdefault("_errors", {})[w.name] = f"{type(exc).__name__}: {exc}"
            continue
        for tag, n in stats["constructions"].items():
            built[tag] = built.get(tag, 0) + n
        if "hung" in stats:  # calls past their timeout, each still on a thread of this process
            threads[w.name] = {k: stats.get(k, 0) for k in ("hung", "hung_peak", "timed_out",
                                                             "refused", "closed_late")}
    return {"pools": pools, "constructions": built, "threads": threads}


def _ask_engines(p: Pipeline, method: str, answer: Callable[[Any], Any],
                 failed: Callable[[str], Any]) -> dict[str, Any]:
    """``{engine name: answer(reply)}`` for every engine's reply to ``method`` (30 s each),
    ``failed("Type: message")`` for an engine that raised or did not answer in time, or
    ``{"error": ...}`` when the engines could not be asked at all."""
    engines = p.weight_sync.engines

    async def gather() -> list[Any]:
        return list(await asyncio.gather(*(asyncio.wait_for(e.call(method), 30)
                                           for e in engines), return_exceptions=True))

    try:
        replies = asyncio.run(gather())
    except Exception as exc:  # noqa: BLE001 - reported in summary.json, never masks
        return {"error": f"{type(exc).__name__}: {exc}"[:500]}
    return {e.name: (answer(r) if not isinstance(r, BaseException)
                     else failed(f"{type(r).__name__}: {r}"))
            for e, r in zip(engines, replies, strict=True)}


def _engine_versions(p: Pipeline) -> dict[str, Any]:
    """The version each engine serves at the end, or the error that kept one from saying
    (a dead engine; a restarted one that has not reloaded says so)."""
    return _ask_engines(p, "weights_status", lambda a: int(a["engine_version"]),
                        lambda err: err[:300])


def _engine_stats(p: Pipeline) -> dict[str, Any]:
    """Each engine worker's counters at run end (tokens prefilled, reused, generated; KV
    cache; PD hand-off errors), or the error that kept one from answering."""
    return _ask_engines(p, "stats", lambda s: s, lambda err: {"error": err[:500]})


def _cancel_on_sigterm(signals: list[str]) -> None:
    """SIGTERM inside the event loop ends the run as asyncio.run ends it on Ctrl-C: the
    main task is cancelled at an await, so every cleanup runs in order. (A
    KeyboardInterrupt raised from a signal handler lands between any two bytecodes, e.g.
    between a trajectory's finish and its count: CI once lost 3 trajectories so.)"""
    import signal
    import threading

    task = asyncio.current_task()
    if task is None or threading.current_thread() is not threading.main_thread():
        return

    def on_sigterm() -> None:
        signals.append("SIGTERM")
        task.cancel()

    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, on_sigterm)


def _quiet_cancellations(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The loop's error handler: a cancellation is how a stop ends the calls in flight,
    not an error. When the run stops, the calls still running (a gather of worker calls
    whose task is cancelled with them) end cancelled, and asyncio's default handler
    would print each as "_GatheringFuture exception was never retrieved" with a
    traceback. Everything else goes to the default handler."""
    if isinstance(context.get("exception"), asyncio.CancelledError):
        return
    loop.default_exception_handler(context)


def run_job(job: Job, steps: int, progress: bool = True) -> list[StepRecord]:
    """Run the pipeline with a live display; a final checkpoint even on Ctrl-C."""
    from rollart_sdk.control.metrics import learning_summary, run_rollout_summary
    from rollart_sdk.control.progress import ProgressDisplay

    display = ProgressDisplay(job.config, steps, enabled=progress)
    job.pipeline.on_step = _step_callback(job, display, steps)
    job.pipeline.on_eval = _eval_callback(job, display)
    interrupted = False

    async def main() -> None:
        # Blocking calls of in-process workers (env steps, engine steps) run on the loop's
        # default executor: give it room for every concurrent environment.
        from concurrent.futures import ThreadPoolExecutor

        asyncio.get_running_loop().set_default_executor(
            ThreadPoolExecutor(max_workers=job.pipeline.scheduler.max_running + 16)
        )
        _cancel_on_sigterm(signals)
        asyncio.get_running_loop().set_exception_handler(_quiet_cancellations)
        if job.resume is not None:
            await _restore(job)
        await job.pipeline.run(steps)

    error: Exception | None = None
    signals: list[str] = []

    def on_sigterm(signum: int, frame: Any) -> None:
        # SIGTERM (Kubernetes, Slurm, docker stop, systemd) ends the run like Ctrl-C:
        # final checkpoint, summary, flushed logs; `rollart train` exits 143.
        signals.append("SIGTERM")
        raise KeyboardInterrupt

    import signal
    import threading

    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, on_sigterm) if in_main else None
    with display:
        try:
            asyncio.run(main())
        except (KeyboardInterrupt, asyncio.CancelledError) as exc:
            if isinstance(exc, asyncio.CancelledError) and not signals:
                raise  # not our SIGTERM: a cancellation we did not ask for
            interrupted = True
        except Exception as exc:  # noqa: BLE001 - re-raised after the final checkpoint
            error = exc
        finally:
            if in_main:
                signal.signal(signal.SIGTERM, previous)
    job.signal = signals[0] if signals else ("SIGINT" if interrupted else None)
    if job.resume is not None and not job.restored:
        _end_unrestored(job, interrupted, error)

    save_errors = [*job.pipeline.checkpoint_errors, *_final_checkpoint(job)]
    p = job.pipeline
    summary: dict[str, Any] = {
        # Steps trained (each has its metrics line), sessions before a resume too; a batch
        # formed whose train step the stop cut is not one.
        "steps": p.steps_done,
        "interrupted": interrupted,
        # Ray's error texts carry terminal colour codes: plain text in the file.
        "error": plain(f"{type(error).__name__}: {error}") if error else None,
        "signal": job.signal,
        "checkpoint_errors": [plain(e) for e in save_errors],
        "newest_checkpoint": newest_checkpoint(job.run_dir.checkpoints),
        # Accounting: launched = trained + sum(dropped) (reason -> count).
        "launched": p.scheduler.launched,
        "trained": p.buffer.trained,
        "dropped": dict(p.buffer.dropped),
        "trajectories_trained": p.buffer.trained,
        # Dynamic sampling: groups dropped as zero_variance, and kept past the cap.
        "filtered_groups": p.buffer.filtered_groups,
        "zero_variance_kept": p.buffer.zero_variance_kept,
        "retried": p.scheduler.retried,
        "drop_examples": job.run_dir.drop_examples,
        "engine_recovery": {**p.recovery.summary(), "rerouted_requests": p.proxy.rerouted,
                            "down_at_end": dict(p.proxy.down)},
        "engine_versions": _engine_versions(p),
        "env_close_errors": dict(job.run_dir.close_errors),
        # Errors beside a trajectory's outcome (a finish hook, an env slot): count, examples.
        "side_errors": {"count": p.scheduler.side_error_count,
                        "examples": list(p.scheduler.side_errors)},
        "events_not_written": job.run_dir.events_dropped,
        "rollout_s": (p.ended or time.time()) - p.started,  # start to the rollout's stop
        "rollout": run_rollout_summary(p),
        "served": {f"{tag}@{w}": n for (tag, w), n in p.proxy.served.items()},
        "weight_updates": [vars(r) for r in p.update_reports],
        "wall_time_s": time.time() - p.started,  # this session
        "resumed_from": str(job.resume.checkpoint) if job.resume else None,
        "resumes": p.resumes,
        "layout": job.layout.to_json() if job.layout else None,
        "envs": env_summary(job),
        "learning": learning_summary(p),
        "eval": p.eval_lines[-1] if p.eval_lines else None,  # the last held-out evaluation
        "engines": _engine_stats(p),
        "sinks": _close_sinks(job),
    }
    written = _write_summary(job, summary)
    job.run_dir.close()
    error = error or (written if not interrupted else None)
    if interrupted:
        raise KeyboardInterrupt
    if error is not None:
        raise error
    return p.records


def _step_callback(job: Job, display: Any, steps: int) -> Any:
    """What each trained step does in the driver: its metrics line, its samples
    (samples.jsonl; dropped trajectories are seen as they finish), console warnings on
    action diagnostics, the progress display."""
    from rollart_sdk.control.diagnostics import ActionWatch
    from rollart_sdk.control.samples import sample_log

    samples = sample_log(job.config, job.run_dir.path, job.pipeline.scheduler, steps)
    job.pipeline.scheduler.on_finish.append(samples.finished)
    watch = ActionWatch()

    if job.sinks is not None:
        job.sinks.warn = display.warn

    said_no_signal: set[str] = set()

    def on_step(rec: StepRecord, metrics: dict[str, Any]) -> None:
        job.run_dir.log_metrics(metrics)
        for line in no_signal_warnings(rec, job.config, said_no_signal):
            display.warn(line)
        samples.step(rec)
        if job.sinks is not None:
            job.sinks.step(metrics, samples.last)
        for line in watch.check(metrics):
            display.warn(line)
        display.update(metrics)

    return on_step


def no_signal_warnings(rec: StepRecord, cfg: RunConfig, said: set[str]) -> list[str]:
    """Dynamic sampling hit its cap: per task (the first time), that its groups keep
    having equal rewards, so it gives no learning signal now."""
    out = []
    for tag, rewards in sorted(rec.zero_variance_kept.items()):
        if tag in said:
            continue
        said.add(tag)
        seen = ", ".join(sorted({str(r) for r in rewards}))
        out.append(
            f"task {tag!r} gives no learning signal: at step {rec.step + 1}, after "
            f"{rec.filtered_groups} equal-reward groups were filtered "
            f"(rollout.max_filtered_per_step {cfg.rollout.filter_cap}), {len(rewards)} more "
            f"had every reward equal ({seen}) and are trained as they are (advantage 0). "
            "The task is too hard or too easy for the model now: check its reward "
            "(rollart samples RUN) or its difficulty; this is said once per task")
    return out


def _close_sinks(job: Job) -> dict[str, Any]:
    """Close the metric sinks (their last writes); per sink, the failures counted."""
    if job.sinks is None:
        return {}
    job.sinks.close()
    return job.sinks.summary()


def _eval_callback(job: Job, display: Any) -> Callable[[dict[str, Any]], None]:
    """Each held-out evaluation: its line in metrics.jsonl (``"kind": "eval"``) and a
    console line per task."""

    def on_eval(line: dict[str, Any]) -> None:
        job.run_dir.log_metrics(line)
        if job.sinks is not None:  # the metric sinks get eval/<tag>/... too
            job.sinks.step(line)
        for tag in sorted({k.split("/")[1] for k in line if k.startswith("eval/") and
                           k.count("/") == 2}):
            succ, rew = line[f"eval/{tag}/success"], line[f"eval/{tag}/reward"]
            job.pipeline.say(
                f"eval after {line['step']} steps: {tag} success "
                f"{'n/a' if succ is None else f'{succ:.3f}'}, reward "
                f"{'n/a' if rew is None else f'{rew:.3f}'} "
                f"({line[f'eval/{tag}/episodes']} episodes)")

    return on_eval


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def plain(text: str) -> str:
    """``text`` without terminal colour codes (Ray colours its error texts)."""
    return _ANSI.sub("", text)


def _end_unrestored(job: Job, interrupted: bool, error: Exception | None) -> None:
    """The resume did not get to load a checkpoint: the run directory stays exactly as it
    was (no checkpoint, final_model/, metrics or summary.json written). Raises."""
    from rollart_sdk.control.resume import ResumeFailed

    job.run_dir.close()
    if interrupted:
        raise KeyboardInterrupt
    assert error is not None and job.resume is not None
    if isinstance(error, ResumeFailed):
        raise error
    raise ResumeFailed(f"--resume {job.resume.run_dir}: {type(error).__name__}: {error}"
                       "; nothing in the run directory was changed") from error


def _write_summary(job: Job, summary: dict[str, Any]) -> OSError | None:
    """summary.json, atomically (the old one or this one, never a torn file); a full disk
    is said in one line and returned, so the run's own error stays the error shown."""
    try:
        job.run_dir.write_json("summary.json", summary)
    except OSError as exc:
        print(f"warning: summary.json not written ({type(exc).__name__}: {exc}); the "
              "previous one, if any, is left as it was", file=sys.stderr)
        return exc
    return None


async def _restore(job: Job) -> None:
    """Load the resume point's checkpoint; when the trainer cannot load it (or its
    version disagrees with its run state), the next older complete checkpoint that passes
    verification, saying why. Only once one is loaded are the metrics lines past it moved
    aside. Raises ResumeFailed when none loads (nothing written)."""
    from rollart_sdk.control.resume import CheckpointUnusable, ResumeFailed, find_loadable

    rp = job.resume
    assert rp is not None
    ckpt, state, older = rp.checkpoint, rp.state, list(rp.older)
    failed: list[str] = []
    while True:
        try:
            await job.pipeline.restore(str(ckpt), state)
            break
        except CheckpointUnusable as exc:
            failed.append(f"{ckpt.name}: {exc.why}")
            nxt = find_loadable(older, failed)
            if nxt is None:
                raise ResumeFailed(
                    f"--resume {rp.run_dir}: no checkpoint could be loaded ("
                    + "; ".join(failed) + "); nothing in the run directory was changed") from exc
            older = older[older.index(nxt[0]) + 1:]
            job.pipeline.say(f"checkpoint {failed[-1]}; trying {nxt[0].name}")
            ckpt, state = nxt[0].path, nxt[1]
    rp.checkpoint, rp.state = ckpt, state
    job.restored = True
    moved = job.run_dir.rollback_metrics(int(state["step"]))
    job.pipeline.say(f"resumed from {ckpt} ({state['step']} steps done)"
                     + (f"; {moved} metrics lines past it moved to metrics.rolledback.jsonl"
                        if moved else ""))


def _final_checkpoint(job: Job) -> list[str]:
    """The final checkpoint (``checkpoints/step-N``, unless this session already saved or
    resumed from the one of that step) and model; the errors, if any, said and returned
    as lines for the summary."""
    errors = _final_saves(job)
    for line in errors:
        job.pipeline.say(f"warning: {line}")
    return errors


def _final_saves(job: Job) -> list[str]:
    # Whatever ended the run (done, Ctrl-C, a failed weight sync), keep what was trained.
    # Every trainer rank takes part (collective for a tensor-parallel trainer). A dead
    # trainer cannot save: that is recorded, and the original error stays the error.
    p = job.pipeline
    try:
        version = int(job.spawner.call(job.trainers[0], "version", timeout=60))
        # First: a batch the trainer finished, its answer lost, counts as trained in the
        # saved state too.
        p.report_trained(version)  # trained, interrupted before its line
        asyncio.run(asyncio.wait_for(p.save_checkpoint(version, version, "final"), 600))
    except Exception as exc:  # noqa: BLE001 - reported in summary.json, never masks
        newest = p.newest_checkpoint_name()
        return [f"final checkpoint failed: {type(exc).__name__}: {exc}"[:1000]
                + f"; {newest or 'no checkpoint'} stays the newest"]
    if not job.config.train.save_final_model:
        return []
    from rollart_sdk import durable

    # Written beside final_model/ and renamed over it once complete: a failed save leaves
    # the previous final_model/ as it was.
    final = job.run_dir.path / "final_model"
    partial = final.with_name(f".final_model.{os.getpid()}.partial")
    try:
        shutil.rmtree(partial, ignore_errors=True)
        asyncio.run(asyncio.wait_for(p.all_trainers("save_pretrained", str(partial)), 600))
        durable.fsync_tree(partial)
        durable.replace_dir(partial, final)
    except Exception as exc:  # noqa: BLE001 - reported in summary.json, never masks
        shutil.rmtree(partial, ignore_errors=True)
        return [f"save_pretrained failed: {type(exc).__name__}: {exc}"[:1000]]
    return []
