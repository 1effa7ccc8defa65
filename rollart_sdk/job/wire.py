"""The control plane of a run, wired to its started workers: each task's runtime (prompt
format, system prompt, allowed action tokens, the agent gateway) from what preflight
found, then LLMProxy, RolloutScheduler, SampleBuffer, WeightSync and the Pipeline.

Everything a part of the control plane reports to or reads from is given to its
constructor here: the run's :class:`~rollart_sdk.control.events.RolloutEvents` (with the
readers of its finished and dropped trajectories: the watchdog, the run directory's logs,
the sample log), the watchdog, the step reports, the re-binding of a restarted engine.
Nothing is attached to a part after it is built.

Nothing here refuses the config: every check ran in :mod:`rollart_sdk.job.preflight` before
the first worker started."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rollart_sdk.job.spawn import Workers, max_running

if TYPE_CHECKING:
    from collections.abc import Callable

    from rollart_sdk.config import RunConfig
    from rollart_sdk.control.chat import ChatFormat
    from rollart_sdk.control.env_manager import TaskRuntime
    from rollart_sdk.control.pipeline import Pipeline
    from rollart_sdk.control.run_dir import RunDir
    from rollart_sdk.job.preflight import Preflight


def task_runtimes(cfg: RunConfig, checked: Preflight) -> dict[str, TaskRuntime]:
    """Each task's prompt format (chat template or plain text), system prompt and allowed
    action tokens, as preflight built and checked them; agent tasks share one gateway."""
    from rollart_sdk.control.env_manager import TaskRuntime
    from rollart_sdk.job.preflight import system_prompt

    described = checked.described
    gateway = None
    if any(described[t.tag].get("agent") for t in cfg.tasks):
        from rollart_sdk.gateway import Gateway

        gateway = Gateway()  # one per run, started on the control plane's loop
    tasks: dict[str, TaskRuntime] = {}
    for task in cfg.tasks:
        d = described[task.tag]
        tasks[task.tag] = TaskRuntime(task, system_prompt(task, d),
                                      checked.actions.get(task.tag),
                                      checked.formats[task.tag])
        if d.get("agent"):
            tasks[task.tag].gateway = gateway
            tasks[task.tag].tool_parser = d["tool_parser"]
    return tasks


def env_pool_sizes(cfg: RunConfig, max_running: int) -> dict[str, int]:
    """Pooled environments per task: ``tasks[].env_pool``, by default as many as the run
    keeps busy at once (built lazily, so only the ones a task needs are made). That each
    holds a group is preflight's ``check_env_pools``."""
    sizes = {}
    for task in cfg.tasks:
        size = max_running if task.env_pool is None else task.env_pool
        if size:  # 0: no pool, one environment per trajectory
            sizes[task.tag] = size
    return sizes


def wire_control_plane(cfg: RunConfig, workers: Workers, tasks: dict[str, TaskRuntime],
                       chat: ChatFormat, run_dir: RunDir, reports: Any = None,
                       rebind: Callable[[str], None] | None = None,
                       say: Callable[[str], None] | None = None) -> Pipeline:
    """The control plane on ``workers``: the proxy over the engines, the scheduler over
    the env hosts and reward, the buffer, weight sync and (``eval.every_steps``) the
    evaluator, sharing one ``RolloutEvents`` whose readers are the watchdog, the
    run-directory logs and ``reports.finish_readers``. ``reports``: each step's and
    evaluation's (``step``, ``eval``; job/progress.py); ``rebind``: a restarted engine's
    re-binding (EngineRecovery); ``say``: a line for the user."""
    from rollart_sdk.control.buffer import SampleBuffer
    from rollart_sdk.control.events import RolloutEvents
    from rollart_sdk.control.pipeline import Pipeline, run_watchdog, task_quota
    from rollart_sdk.control.proxy import LLMProxy
    from rollart_sdk.control.scheduler import RolloutScheduler
    from rollart_sdk.control.versions import PolicyVersions
    from rollart_sdk.weights import WeightSync

    r = cfg.rollout
    watchdog = run_watchdog(cfg)
    events = RolloutEvents(
        # Every finished trajectory: the drop-rate rule, env close errors, the samples.
        on_finish=(watchdog.record, run_dir.log_finished,
                   *(reports.finish_readers if reports is not None else ())),
        on_drop=(run_dir.log_drop,))  # drops.jsonl: every trajectory counted dropped
    buffer = SampleBuffer(r.group_size, r.filter_zero_variance, r.filter_cap, events=events)
    proxy = LLMProxy(workers.engines, workers.routes, prefill_workers=workers.prefill,
                     prefill_routes=workers.prefill_routes)
    # Trajectories are stamped with the version the engines serve.
    versions = PolicyVersions()
    running = max_running(cfg)
    scheduler = RolloutScheduler(
        tasks, chat, proxy, workers.envs, workers.reward, buffer,
        version=versions.serving, group_size=r.group_size, max_running=running,
        alpha=r.effective_alpha if r.mode == "async" else None, batch_quota=task_quota(cfg),
        seed=cfg.seed, event_sink=run_dir.log_event, interaction=r.interaction,
        env_pools=env_pool_sizes(cfg, running),
        max_member_retries=cfg.rollout.max_member_retries,
        admission_version=versions.admission_base, events=events, say=say,
    )
    evaluator = None
    if cfg.eval is not None and cfg.eval.every_steps:
        from rollart_sdk.control.evaluation import Evaluator

        # The same proxy (engines), env hosts and reward handle as training; episodes
        # that no buffer or trainer ever sees (control/evaluation.py).
        evaluator = Evaluator.build(cfg, cfg.eval, tasks, chat, proxy, workers.envs,
                                    workers.reward, versions.serving)
    return Pipeline(cfg, proxy, scheduler, buffer, workers.trainers,
                    on_step=reports.step if reports is not None else None,
                    checkpoint_dir=str(run_dir.checkpoints), event_sink=run_dir.log_event,
                    weight_sync=WeightSync(workers.engines + workers.prefill, proxy),
                    versions=versions, watchdog=watchdog, rebind=rebind, say=say,
                    on_eval=reports.eval if reports is not None else None,
                    evaluator=evaluator)


def _legacy_task_runtimes(cfg: RunConfig, described: dict[str, dict[str, Any]],
                          tokenizer: Any) -> dict[str, TaskRuntime]:
    """The old ``rollart_sdk.job._task_runtimes(cfg, described, tokenizer)``: the formats
    and action ids built here (the checks are preflight's; a problem raises its
    ConfigError). Use :func:`task_runtimes` with :func:`rollart_sdk.job.preflight.preflight`'s
    result."""
    from rollart_sdk.config import ModelConfig
    from rollart_sdk.errors import ConfigError
    from rollart_sdk.job.preflight import Preflight, check_actions, task_formats

    formats, problems, _ = task_formats(cfg, described, tokenizer)
    more, actions = check_actions(cfg, described, formats)
    if problems + more:
        raise ConfigError(problems + more)
    model: ModelConfig = cfg.model
    return task_runtimes(cfg, Preflight(described, model, tokenizer, formats, actions))
