"""``build_job``: the composition root of a run. In order: resolve every backend ->
resource plan -> preflight (every check that can refuse the config; each env built once)
-> each task's runtime -> run directory -> the role workers through a spawner
(:mod:`rollart_sdk.job.spawn`) -> the control plane (:mod:`rollart_sdk.job.wire`).
Nothing after the first worker starts refuses the config. How the workers run (real, or on
simulated time) is the ``runtime``'s choice (:mod:`rollart_sdk.job.runtime`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rollart_sdk.config import RunConfig
from rollart_sdk.job import spawn
from rollart_sdk.job.run_dir import abandon
from rollart_sdk.job.runtime import Runtime
from rollart_sdk.job.wire import wire_control_plane
from rollart_sdk.resources import memory

if TYPE_CHECKING:
    from collections.abc import Callable

    from rollart_sdk.cluster.spawn import Spawner
    from rollart_sdk.config import LineMap
    from rollart_sdk.config.resolve import ResolvedRun
    from rollart_sdk.control.handles import WorkerHandle
    from rollart_sdk.control.pipeline import Pipeline, StepRecord
    from rollart_sdk.control.run_dir import RunDir
    from rollart_sdk.control.sinks import SinkSet
    from rollart_sdk.job.resume import ResumePoint
    from rollart_sdk.job.spawn import Workers
    from rollart_sdk.layout import Layout
    from rollart_sdk.registry import Registry
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
    workers: Workers | None = None  # every started worker's handle, as the plane is wired
    # What each step and evaluation does in the driver (job/progress.py::StepReports; the
    # simulator's sim/job.py::SimStepReports); ``run_job`` shows it on its display.
    reports: Any = None

    def close(self) -> None:
        if self.sinks is not None:
            self.sinks.close()
        self.spawner.close()


def build_job(cfg: RunConfig, lines: LineMap | None = None, run_name: str | None = None,
              log: Any = print, in_process: bool = False, registry: Registry | None = None,
              resume: ResumePoint | None = None, layout: Layout | None = None,
              runtime: Runtime | None = None,
              on_step: Callable[[StepRecord, dict[str, Any]], None] | None = None) -> Job:
    """Check the config, then spawn every worker and wire the control plane.

    ``in_process=True`` runs every worker in this process (no Ray): the control plane and
    the backends are the same code; only placement and process boundaries are skipped,
    and the ``ray`` transport is replaced by ``local`` (rollart_sdk/layout.py).
    ``layout``: the layout chosen for the run (``rollart train``); it sets ``in_process``
    and is recorded in ``plan.json`` and ``summary.json``.
    ``registry``: resolve backends there instead of the installed plugins (tests).
    ``resume``: continue that run (its directory; ``run_job`` loads the checkpoint).
    ``runtime``: how the workers run (:mod:`rollart_sdk.job.runtime`; default: for real;
    ``rollart sim`` passes the simulator's).
    ``on_step``: called with each trained step's record and metrics line (after the run
    directory's own reports), e.g. by a benchmark that drives ``job.pipeline.run`` itself.
    """
    from rollart_sdk.config.resolve import resolve_run
    from rollart_sdk.control.run_dir import RunDir
    from rollart_sdk.layout import inprocess_config
    from rollart_sdk.plugins import get_plugins
    from rollart_sdk.resources.plan import plan_resources

    runtime = runtime or Runtime()
    if layout is not None:
        in_process = layout.in_process
    if runtime.in_process is not None:
        in_process = runtime.in_process
    resolved = resolve_run(inprocess_config(cfg) if in_process else cfg,
                           registry or get_plugins().registry, lines, in_process=in_process)
    plan = plan_resources(cfg, resolved, workers=runtime.role_workers())
    # Before any worker starts (and before the run directory exists): every check that can
    # refuse the config. The env facts (action words) shape a tiny tokenizer.
    checked = runtime.check(cfg, resolved, plan, lines, log, output_dir=resume is None)
    tasks = runtime.task_runtimes(cfg, checked)
    log(f"model: {checked.model.path}")
    if resume is not None:
        resume.announce(log)
    run_dir = RunDir(cfg.output_dir, cfg, run_name,
                     resume=resume.run_dir if resume is not None else None)
    log(f"run directory: {run_dir.path}")
    for warning in plan.warnings:
        log(f"warning: {warning}")
    threads = _threads(cfg, in_process, chosen=layout is not None)
    spawner = _spawner(runtime, cfg, resolved, plan, run_dir, in_process,
                       resumed=resume is not None)
    try:
        workers = spawn.spawn_workers(cfg, resolved, plan, checked.model, spawner,
                                      checked.described, threads, **runtime.spawn_options())
    except BaseException:
        spawner.close()  # the workers already started (all clusters start at once)
        abandon(run_dir, resumed=resume is not None)
        raise
    if spawner.shared_compute is not None:  # a sync run in process (cluster/spawn.py)
        threads = {**threads, "engine_on_trainer_thread": True}
    chat = tasks[cfg.tasks[0].tag].prompt_format  # the scheduler's default format

    def rebind(worker: str) -> None:  # a restarted engine: its record counts the restart
        spawner.rebind(worker)
        run_dir.write_json("bindings.json", spawner.bindings())

    sinks = _start_sinks(cfg, resolved, run_dir, log)
    reports = runtime.step_reports(cfg, run_dir, tasks, chat, sinks, log, on_step)
    pipeline = wire_control_plane(cfg, workers, tasks, chat, run_dir, reports=reports,
                                  rebind=rebind, say=log)
    run_dir.write_json("plan.json", {**plan.to_json(), "threads": threads,
                                     **({"layout": layout.to_json()} if layout else {}),
                                     **({"host_memory": memory.describe()} if in_process
                                        else {})})
    run_dir.write_json("bindings.json", spawner.bindings())
    return Job(cfg, run_dir, pipeline, workers.trainers, spawner, resume=resume, layout=layout,
               sinks=sinks, workers=workers, reports=reports)


def _threads(cfg: RunConfig, in_process: bool, chosen: bool) -> dict[str, Any]:
    """Threads per role (processes share the cores without oversubscription). In process
    each worker runs on a thread of its own and torch's thread count is per thread, so a
    run whose layout was chosen (``rollart train``) gets the plan as on Ray; a direct
    ``build_job(in_process=True)`` (tests, notebooks) keeps ROLLART_TORCH_THREADS, else 1,
    for every worker (tests run two at a time on two cores)."""
    from rollart_sdk.resources.threads import thread_plan

    threads: dict[str, Any] = thread_plan(cfg)
    if in_process:
        # no burst threads in one process: a second OpenMP team there slows every team
        # (a sync run's engine computes on the trainer's thread instead: cluster/spawn.py)
        threads["actor_gen_burst"] = threads["actor_gen"]
    if in_process and not chosen:
        threads.update(actor_gen=None, actor_gen_burst=None, actor_train=None)
    return threads


def _spawner(runtime: Runtime, cfg: RunConfig, resolved: ResolvedRun, plan: ResourcePlan,
             run_dir: RunDir, in_process: bool, resumed: bool) -> Spawner:
    """In process, or on Ray (its placement groups made here); a run whose spawner cannot
    start leaves no new run directory."""
    try:
        return runtime.spawner(cfg, resolved, plan, run_dir, in_process)
    except BaseException:
        abandon(run_dir, resumed=resumed)
        raise


def _start_sinks(cfg: RunConfig, resolved: ResolvedRun, run_dir: RunDir, log: Any) -> SinkSet:
    """The metric sinks of ``logging:``, started with the run's config (control/sinks.py)."""
    from rollart_sdk.control.sinks import SinkSet

    sinks = SinkSet.start(resolved.sinks, str(run_dir.path), run_dir.path.name,
                          cfg.model_dump(mode="json"), warn=lambda m: log(f"warning: {m}"))
    if sinks.sinks:
        log(f"metric sinks: {', '.join(s.name for s in sinks.sinks)}")
    return sinks
