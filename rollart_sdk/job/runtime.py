"""How a run's workers run: the one choice :func:`~rollart_sdk.job.build.build_job` leaves
open. :class:`Runtime` is a real run's (Ray, or in process): the config's preflight, each
task's prompt format from the model's tokenizer, the role workers through a Ray or local
spawner. A run on simulated time passes its own (:class:`rollart_sdk.sim.job.SimRuntime`):
the sim's checks and token format, every worker in this process called on the virtual-time
loop, the sim backends offered the run's ``sim`` context. The composition in between
(resolve -> plan -> checks -> run directory -> workers -> control plane) is ``build_job``'s
alone."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    from rollart_sdk.cluster.spawn import Spawner
    from rollart_sdk.config import LineMap, RunConfig
    from rollart_sdk.config.resolve import ResolvedRun
    from rollart_sdk.control.chat import ChatFormat
    from rollart_sdk.control.env_manager import TaskRuntime
    from rollart_sdk.control.pipeline import StepRecord
    from rollart_sdk.control.run_dir import RunDir
    from rollart_sdk.control.sinks import SinkSet
    from rollart_sdk.job.build import Job
    from rollart_sdk.job.preflight import Preflight
    from rollart_sdk.resources.plan import ResourcePlan


class Runtime:
    """A real run's workers (see the module docstring); a subclass overrides a step."""

    in_process: bool | None = None  # None: the layout's / the caller's choice
    # Why a run on this runtime cannot be resumed (None: it can, from its checkpoints).
    no_resume: str | None = None

    def role_workers(self) -> dict[str, type]:
        """The worker class of each role (the plan checks their decorators)."""
        from rollart_sdk.cluster.roles import ROLE_WORKERS

        return ROLE_WORKERS

    def check(self, cfg: RunConfig, resolved: ResolvedRun, plan: ResourcePlan,
              lines: LineMap | None, log: Any, output_dir: bool = True,
              build_model: bool = True) -> Preflight:
        """Every check that can refuse the config, before any worker starts."""
        from rollart_sdk.job.preflight import preflight

        return preflight(cfg, resolved, lines, log, build_model=build_model,
                         output_dir=output_dir)

    def task_runtimes(self, cfg: RunConfig, checked: Preflight) -> dict[str, TaskRuntime]:
        from rollart_sdk.job.wire import task_runtimes

        return task_runtimes(cfg, checked)

    def spawner(self, cfg: RunConfig, resolved: ResolvedRun, plan: ResourcePlan,
                run_dir: RunDir, in_process: bool) -> Spawner:
        from rollart_sdk.cluster.spawn import LocalSpawner, RaySpawner, shares_compute

        return (LocalSpawner(plan, share_compute=shares_compute(cfg, in_process)) if in_process
                else RaySpawner(cfg, plan, resolved.placement.create(), run_dir.path.name))

    def spawn_options(self) -> dict[str, Any]:
        """Keyword arguments of :func:`~rollart_sdk.job.spawn.spawn_workers` (``offer``,
        ``env_host``)."""
        return {}

    def step_reports(self, cfg: RunConfig, run_dir: RunDir, tasks: dict[str, TaskRuntime],
                     chat: ChatFormat, sinks: SinkSet | None, say: Any,
                     also: Callable[[StepRecord, dict[str, Any]], None] | None = None) -> Any:
        """What each step and evaluation does in the driver (the pipeline's ``on_step``
        and ``on_eval``, and readers of the finished trajectories): ``job/progress.py``'s
        :class:`~rollart_sdk.job.progress.StepReports`."""
        from rollart_sdk.job.progress import StepReports

        return StepReports.for_run(cfg, run_dir, tasks, chat, sinks, say, also)

    def run(self, job: Job, steps: int, progress: bool = True) -> None:
        """Run the built job's pipeline for ``steps`` steps with a live display;
        ``summary.json`` and the final checkpoint are written whatever ends it."""
        from rollart_sdk.job.run import run_job

        run_job(job, steps, progress=progress)
