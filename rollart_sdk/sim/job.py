"""A simulated job: the real job, its workers and control plane, run on virtual time.

``build_sim_job`` is :func:`rollart_sdk.job.build_job` with the simulator's
:class:`SimRuntime` (:mod:`rollart_sdk.job.runtime`): the sim's checks instead of the real
preflight (the backends must model time, the ``sim:`` section's model and hardware, the
devices, each first prompt against its budget: :mod:`rollart_sdk.sim.preflight`), the sim's
token format (:class:`~rollart_sdk.sim.backends.SimFormat`), every worker in this process
called on the loop (:class:`~rollart_sdk.cluster.spawn.LocalSpawner`), the sim backends
offered the run's :class:`~rollart_sdk.sim.backends.SimContext` and every task's envs on
the virtual-time env host. ``run_sim`` runs the pipeline on a
:class:`~rollart_sdk.sim.clock.VirtualTimeLoop` and writes ``metrics.jsonl``,
``events.jsonl`` (the timeline, in virtual seconds from the start's wall time) and
``summary.json`` like a real run.
"""

from __future__ import annotations

import copy
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollart_sdk.config import RunConfig
from rollart_sdk.errors import ConfigError
from rollart_sdk.job.runtime import Runtime

if TYPE_CHECKING:
    from collections.abc import Callable

    from rollart_sdk.cluster.spawn import Spawner
    from rollart_sdk.config import LineMap
    from rollart_sdk.control.env_manager import TaskRuntime
    from rollart_sdk.control.pipeline import Pipeline, StepRecord
    from rollart_sdk.control.run_dir import RunDir
    from rollart_sdk.job.build import Job
    from rollart_sdk.job.preflight import Preflight
    from rollart_sdk.registry import Registry
    from rollart_sdk.sim.backends import SimContext
    from rollart_sdk.types import Trajectory

SIM_BACKENDS = ("engine", "trainer", "transport")


@dataclass
class SimJob:
    """A built simulated run: the :class:`~rollart_sdk.job.build.Job`, and what
    ``run_sim`` measured."""

    job: Job
    virtual_s: float = 0.0
    wall_s: float = 0.0
    metrics: list[dict[str, Any]] = field(default_factory=list)

    @property
    def config(self) -> RunConfig:
        return self.job.config

    @property
    def run_dir(self) -> RunDir:
        return self.job.run_dir

    @property
    def pipeline(self) -> Pipeline:
        return self.job.pipeline

    @property
    def engines(self) -> list[Any]:
        """The engine workers' handles (prefill engines of PD too)."""
        w = self.job.workers
        return [] if w is None else w.engines + w.prefill

    @property
    def trainers(self) -> list[Any]:
        return self.job.trainers

    @property
    def envs(self) -> list[Any]:
        """The virtual-time env hosts' handles (every task's)."""
        w = self.job.workers
        return [] if w is None else next(iter(w.envs.values()), [])

    @property
    def reward(self) -> Any:
        """The reward router (``set_backend``: the shared reward pools)."""
        w = self.job.workers
        return None if w is None else w.reward.target


class SimRuntime(Runtime):
    """How a simulated run's workers run (see the module docstring)."""

    in_process = True
    no_resume = "a run on simulated time (clock: simulated) keeps no checkpoints"

    def __init__(self, log: Any = print) -> None:
        self.context: SimContext | None = None  # set by check()
        self.log = log  # run_sim's progress lines (sim.progress_every)

    def role_workers(self) -> dict[str, type]:
        return sim_role_workers()

    def check(self, cfg: RunConfig, resolved: Any, plan: Any, lines: LineMap | None,
              log: Any, output_dir: bool = True, build_model: bool = True) -> Preflight:
        """The sim's checks (backends that model time, the ``sim:`` section, devices,
        first prompts); the sim's token format for every task."""
        from rollart_sdk.job.preflight import Preflight
        from rollart_sdk.sim.backends import SimFormat
        from rollart_sdk.sim.preflight import sim_preflight

        _check_sim_backends(cfg, resolved)
        self.context = _sim_context(cfg, resolved)
        _check_devices(cfg, plan, resolved)
        sim_preflight(cfg, resolved, plan, lines, log=log)  # what `rollart validate` checks
        fmt = SimFormat(cfg.sim.token_block)
        return Preflight({}, cfg.model, None, {t.tag: fmt for t in cfg.tasks})

    def task_runtimes(self, cfg: RunConfig, checked: Preflight) -> dict[str, TaskRuntime]:
        """Each task in the sim's token ids (limits scaled by ``sim.token_block``)."""
        from rollart_sdk.control.env_manager import TaskRuntime

        return {t.tag: TaskRuntime(_scaled_task(t, cfg.sim.token_block), None, None,
                                   checked.formats[t.tag]) for t in cfg.tasks}

    def spawner(self, cfg: RunConfig, resolved: Any, plan: Any, run_dir: RunDir,
                in_process: bool) -> Spawner:
        from rollart_sdk.cluster.spawn import LocalSpawner

        return LocalSpawner(plan, inline=True)  # virtual time: every call on the loop

    def spawn_options(self) -> dict[str, Any]:
        from rollart_sdk.cluster.envs.virtual import VirtualEnvHost

        assert self.context is not None, "check() comes first"
        return {"offer": {"sim": self.context}, "env_host": VirtualEnvHost}

    def step_reports(self, cfg: RunConfig, run_dir: RunDir, tasks: dict[str, TaskRuntime],
                     chat: Any, sinks: Any, say: Any,
                     also: Callable[[StepRecord, dict[str, Any]], None] | None = None
                     ) -> SimStepReports:
        """Each step's metrics line with its virtual and wall seconds (no samples)."""
        return SimStepReports(run_dir, also)

    def run(self, job: Job, steps: int, progress: bool = True) -> None:
        """The pipeline on a virtual-time loop (:func:`run_sim`); no live display (a
        step takes milliseconds of wall time): ``sim.progress_every`` lines instead."""
        run_sim(SimJob(job), steps, log=self.log)


def _check_sim_backends(cfg: RunConfig, resolved: Any) -> None:
    """A simulated run needs backends that model time (engine/trainer/transport ``sim``);
    a task's env and reward must be ``sim`` too."""
    problems = []
    for kind in SIM_BACKENDS:
        name = getattr(resolved, kind).descriptor.name
        if name != "sim":
            problems.append((f"{kind}.name", f"{name!r} computes for real; a simulated run "
                             f"needs {kind}: {{name: sim}}"))
    for i, t in enumerate(cfg.tasks):
        if resolved.envs[t.tag].descriptor.name != "sim":
            problems.append((f"tasks.{i}.env.name", "a simulated run needs env: {name: sim, "
                             "options: {...the task's workload...}}"))
        if resolved.rewards[t.tag].descriptor.name != "sim":
            problems.append((f"tasks.{i}.reward.name", "a simulated run needs reward: "
                             "{name: sim} (serverless latencies)"))
    if problems:
        raise ConfigError(problems)


def _scaled_task(task: Any, block: int) -> Any:
    """Token limits in token ids: one id stands for ``block`` modelled tokens."""
    if block == 1:
        return task
    sampling = task.sampling.model_copy(
        update={"max_new_tokens": max(1, task.sampling.max_new_tokens // block)})
    return task.model_copy(update={"sampling": sampling,
                                   "max_context_tokens": max(1, task.max_context_tokens // block)})


def build_sim_job(cfg: RunConfig, lines: LineMap | None = None, run_name: str | None = None,
                  log: Any = print, registry: Registry | None = None) -> SimJob:
    """``build_job`` with the simulator's :class:`SimRuntime`."""
    from rollart_sdk.job.build import build_job

    return SimJob(build_job(cfg, lines, run_name, log=log, registry=registry,
                            runtime=SimRuntime(log)))


def sim_role_workers() -> dict[str, type]:
    """The worker class of each role in a simulated run (``rollart validate`` checks their
    decorators against the pools): the real ones, the env role's on virtual time."""
    from rollart_sdk.cluster.envs.virtual import VirtualEnvHost
    from rollart_sdk.cluster.roles import ROLE_WORKERS

    return {**ROLE_WORKERS, "environment": VirtualEnvHost}


def _sim_context(cfg: RunConfig, resolved: Any) -> SimContext:
    """What the sim backends are offered: the ``sim:`` section's model and hardware
    classes (checked here), the token block, each task's response lengths."""
    from rollart_sdk.sim.backends import SimContext, SimEnvOptions
    from rollart_sdk.sim.costs import resolve_hardware

    sim = cfg.sim
    try:
        spec = sim.model_spec()
        for p in cfg.pools:
            if p.kind == "gpu":
                resolve_hardware(p.hardware, sim.hardware)
    except ValueError as exc:
        raise ConfigError([("sim", str(exc))]) from None
    response = {tag: SimEnvOptions.model_validate(res.options.model_dump()).response_tokens
                for tag, res in resolved.envs.items()}
    return SimContext(spec, dict(sim.hardware), response, sim.token_block)


def _check_devices(cfg: RunConfig, plan: Any, resolved: Any) -> None:
    """Engines and trainer ranks take ``devices`` devices each: they must fit the pools."""
    used: dict[str, float] = {}
    eng = resolved.engine.options
    gen = plan.role("actor_gen")
    for pool, n in [*gen.workers_per_pool.items(), *gen.prefill_per_pool.items()]:
        dev = eng.devices_by_hardware.get(cfg.pool(pool).hardware, eng.devices)
        used[pool] = used.get(pool, 0.0) + n * dev
    train_pool = plan.role("actor_train").preferred
    used[train_pool] = used.get(train_pool, 0.0) + (cfg.roles.actor_train.workers
                                                    * resolved.trainer.options.devices)
    problems = []
    for pool, n in used.items():
        have = cfg.pool(pool).count
        if n > have:
            problems.append((f"pools ({pool})", f"the simulated engines and trainer ranks take "
                             f"{n:g} devices of pool {pool!r}, which has {have:g}; raise its "
                             "count or lower engine.options.devices / trainer.options.devices "
                             "/ roles.*.workers"))
    if problems:
        raise ConfigError(problems)


class SimStepReports:
    """A simulated run's step reports, the pipeline's ``on_step`` from its construction
    (:meth:`SimRuntime.step_reports`): each step's metrics line, with ``sim/virtual_s``,
    ``sim/wall_s`` and ``sim/rss_mb``, written to ``metrics.jsonl`` and kept in the
    ``SimJob``'s ``metrics``, and a progress line every ``sim.progress_every`` steps.
    Nothing is reported before :meth:`show` (``run_sim``); ``also`` (``build_job``'s
    ``on_step``) is called after."""

    finish_readers: tuple[Callable[[Trajectory], None], ...] = ()

    def __init__(self, run_dir: RunDir,
                 also: Callable[[StepRecord, dict[str, Any]], None] | None = None) -> None:
        self.run_dir = run_dir
        self.also = also
        self.metrics: list[dict[str, Any]] | None = None  # until show()
        self.log: Any = None
        self.steps = 0
        self.every = 0
        self.t0 = 0.0

    def show(self, metrics: list[dict[str, Any]], log: Any, steps: int, every: int) -> None:
        """Report from now on into ``metrics``; ``log`` a line every ``every`` steps."""
        self.metrics, self.log, self.steps, self.every = metrics, log, steps, every
        self.t0 = time.perf_counter()

    def step(self, rec: StepRecord, metrics: dict[str, Any]) -> None:
        if self.metrics is not None:
            metrics["sim/virtual_s"] = metrics.get("wall_time")
            metrics["sim/wall_s"] = round(time.perf_counter() - self.t0, 3)
            metrics["sim/rss_mb"] = _rss_mb()  # memory stays flat over a long run
            self.run_dir.log_metrics(metrics)
            self.metrics.append(metrics)
            if self.log is not None and self.every and (rec.step + 1) % self.every == 0:
                log = self.log
                log(f"step {rec.step + 1}/{self.steps}: {metrics.get('wall_time') or 0.0:.0f} "
                    f"virtual s, {time.perf_counter() - self.t0:.0f} wall s")
        if self.also is not None:
            self.also(rec, metrics)

    def eval(self, line: dict[str, Any]) -> None:
        """A held-out evaluation: kept in ``Pipeline.eval_lines`` only (a simulated run
        writes no evaluation lines)."""


def run_sim(job: SimJob, steps: int, log: Any = None) -> list[StepRecord]:
    """Run ``steps`` training steps on virtual time; write metrics, events, summary."""
    from rollart_sdk.control.metrics import learning_summary, run_rollout_summary
    from rollart_sdk.sim.clock import run_virtual

    job.job.reports.show(job.metrics, log, steps, job.config.sim.progress_every)
    t0 = time.perf_counter()
    error: BaseException | None = None
    try:
        records, job.virtual_s = run_virtual(job.pipeline.run(steps))
    except BaseException as exc:  # noqa: BLE001 - re-raised after the summary is written
        error, records = exc, job.pipeline.records
    job.wall_s = time.perf_counter() - t0
    p = job.pipeline
    summary = {
        "clock": "simulated",
        "steps": len(p.records),
        "error": f"{type(error).__name__}: {error}" if error else None,
        "virtual_s": job.virtual_s,
        "wall_s": job.wall_s,
        "launched": p.scheduler.launched,
        "trained": p.buffer.trained,
        "dropped": dict(p.buffer.dropped),
        "retried": p.scheduler.retried,
        "rollout": run_rollout_summary(p),
        "served": {f"{tag}@{w}": n for (tag, w), n in p.proxy.served.items()},
        "engines": engine_summary(job),
        "learning": learning_summary(p),
    }
    job.run_dir.write_json("summary.json", summary)
    job.run_dir.close()
    job.job.close()  # the metric sinks of ``logging:``, the spawner
    if error is not None:
        raise error
    return records


def _rss_mb() -> float | None:
    """This process's resident memory (Linux), MB."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    import os

    return round(pages * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)


def engine_stats(handle: Any) -> dict[str, Any]:
    """A sim engine's statistics (``SimEngine.stats``: its pool and hardware among them),
    with its worker's name."""
    return {"name": handle.name, **handle.target.engine.stats()}


def engine_summary(job: SimJob) -> dict[str, Any]:
    """Per engine: pool, busy fraction of the run, tokens, recompute seconds."""
    out = {}
    for h in job.engines:
        e = h.target.engine
        out[h.name] = {"pool": h.pool, "hardware": h.hardware,
                       "busy_fraction": e.busy_s / job.virtual_s if job.virtual_s else 0.0,
                       "prefill_tokens": e.prefill_tokens, "decode_tokens": e.decode_tokens,
                       "recompute_s": e.recompute_s}
    return out


def step_times(metrics: list[dict[str, Any]]) -> list[float]:
    """Seconds between consecutive steps' metrics lines (the first from the run's start)."""
    ts = [float(m["wall_time"]) for m in metrics]
    return [b - a for a, b in zip([0.0, *ts], ts, strict=False)]


@dataclass
class Outcome:
    """What one simulated run measured (virtual seconds)."""

    step_s: float  # mean seconds between steps, warm-up excluded
    rollout_s: float  # mean get_batch wait (sync modes: the whole rollout)
    exposed_sync_s: float  # mean exposed weight-sync seconds
    baseline_sync_s: float | None  # the first update, nothing overlapping
    aborted_stale: int
    trained: int
    virtual_s: float
    wall_s: float
    engine_stats: list[dict[str, Any]]


def simulate(data: dict[str, Any], steps: int, warmup: int = 2) -> Outcome:
    """Run one config (``data`` of a RunConfig) for ``steps`` steps on virtual time, in a
    temporary run directory: what the paper experiments (``rollart sim --experiment``)
    compare."""
    from rollart_sdk.config import load_config

    data = copy.deepcopy(data)
    with tempfile.TemporaryDirectory(prefix="rollart-sim-") as tmp:
        data["output_dir"] = tmp
        cfg, _ = load_config(data=data)
        job = build_sim_job(cfg, log=lambda *a, **k: None)
        run_sim(job, steps)
    ms = job.metrics[warmup:] or job.metrics
    times = step_times(job.metrics)[warmup:] or step_times(job.metrics)
    return Outcome(
        step_s=statistics.fmean(times),
        rollout_s=statistics.fmean(m["time/get_batch_wait"] for m in ms),
        exposed_sync_s=statistics.fmean(m["weight_sync/exposed_s"] for m in ms),
        baseline_sync_s=job.pipeline.sync_baseline_s,
        aborted_stale=sum(m["trajectories/aborted_stale"] for m in job.metrics),
        trained=job.pipeline.buffer.trained,
        virtual_s=job.virtual_s,
        wall_s=job.wall_s,
        engine_stats=[engine_stats(h) for h in job.engines],
    )
