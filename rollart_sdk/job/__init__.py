"""A job: the installed plugins assembled into ROLLART's pipeline, then run.

One module per responsibility:

- :mod:`~rollart_sdk.job.build`: ``build_job``, the composition root (resolve -> plan ->
  preflight -> task runtimes -> run directory -> workers -> control plane) and ``Job``;
- :mod:`~rollart_sdk.job.preflight`: every check that can refuse the config, run before
  the first worker starts (output dir, model, envs probed once, context budgets);
- :mod:`~rollart_sdk.job.env_probe`: each task's env built once for those checks (its
  facts and first observation; a constructor that raises, said where);
- :mod:`~rollart_sdk.job.runtime`: how the workers run (``Runtime``: for real; the
  simulator's ``rollart_sdk.sim.job.SimRuntime``: on virtual time);
- :mod:`~rollart_sdk.job.spawn`: the role workers, through a spawner
  (:mod:`rollart_sdk.cluster.spawn`: Ray, or in-process);
- :mod:`~rollart_sdk.job.wire`: the control plane on the started workers;
- :mod:`~rollart_sdk.job.run`: ``run_job``, the pipeline run with a final checkpoint and
  ``summary.json`` whatever ends it;
- :mod:`~rollart_sdk.job.signals`: the one SIGTERM path;
- :mod:`~rollart_sdk.job.resume`: ``--resume`` (``ResumePoint``, loading its checkpoint);
- :mod:`~rollart_sdk.job.progress`: what each step and evaluation does in the driver;
- :mod:`~rollart_sdk.job.summary`: ``summary.json``;
- :mod:`~rollart_sdk.job.run_dir`: the run directory abandoned, or given the final
  checkpoint and model.

The command line is ``rollart train``
(:mod:`rollart_sdk.cli.train`). The names below were ``rollart_sdk/job.py``'s; the
underscored ones stay for one release (plugins' benches, tests).
"""

from __future__ import annotations

from rollart_sdk.job.build import Job, build_job
from rollart_sdk.job.progress import no_signal_warnings
from rollart_sdk.job.resume import ResumePoint, newest_checkpoint
from rollart_sdk.job.run import run_job
from rollart_sdk.job.spawn import (
    ENGINE_MAX_RESTARTS,
    ENV_MAX_RESTARTS,
    Workers,
    free_port,
    spawn_workers,
)
from rollart_sdk.job.summary import engine_stats, engine_versions, env_summary, plain
from rollart_sdk.job.wire import (
    _legacy_task_runtimes,
    env_pool_sizes,
    task_runtimes,
    wire_control_plane,
)

# The old private names that code outside the package imports (evaluate's callers, the
# serverless reward's bench, tests), for one release.
_Workers = Workers
_wire_control_plane = wire_control_plane
_spawn_workers = spawn_workers
_task_runtimes = _legacy_task_runtimes
_free_port = free_port
_engine_stats = engine_stats
_engine_versions = engine_versions

__all__ = [
    "ENGINE_MAX_RESTARTS", "ENV_MAX_RESTARTS", "Job", "ResumePoint", "Workers", "build_job",
    "env_pool_sizes", "env_summary", "newest_checkpoint", "no_signal_warnings", "plain",
    "run_job", "spawn_workers", "task_runtimes", "wire_control_plane",
]
