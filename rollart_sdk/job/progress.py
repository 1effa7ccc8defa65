"""What the driver does with each trained step and each held-out evaluation while a run
goes: its line in ``metrics.jsonl``, its samples, the metric sinks, console warnings and
the live display (:mod:`rollart_sdk.control.progress`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    from rollart_sdk.config import RunConfig
    from rollart_sdk.control.pipeline import StepRecord
    from rollart_sdk.job.build import Job


def step_callback(job: Job, display: Any, steps: int) -> Callable[[StepRecord, dict[str, Any]],
                                                                    None]:
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


def eval_callback(job: Job) -> Callable[[dict[str, Any]], None]:
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
