"""What the driver does with each trained step and each held-out evaluation while a run
goes: its line in ``metrics.jsonl``, its samples, the metric sinks, console warnings and
the live display (:mod:`rollart_sdk.control.progress`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    from rollart_sdk.config import RunConfig
    from rollart_sdk.control.chat import ChatFormat
    from rollart_sdk.control.env_manager import TaskRuntime
    from rollart_sdk.control.pipeline import StepRecord
    from rollart_sdk.control.run_dir import RunDir
    from rollart_sdk.control.samples import SampleLog
    from rollart_sdk.control.sinks import SinkSet
    from rollart_sdk.types import Trajectory


class StepReports:
    """What each trained step and each held-out evaluation does in the driver: its
    metrics line, its samples (``samples.jsonl``; the dropped trajectories are read from
    the finished-trajectory stream as they finish: ``finish_readers``), the metric sinks,
    console warnings on action diagnostics and on a trained policy that is not the sampled
    one, the progress display.

    Made by ``build_job`` before the control plane: the pipeline is given :meth:`step` and
    :meth:`eval` in its constructor and the run's ``RolloutEvents`` are given
    ``finish_readers``. Nothing is reported before :meth:`show` (``run_job`` calls it with
    its display): a caller that drives ``pipeline.run`` itself reports as it likes, through
    ``build_job(on_step=...)``, which is called after this object's own work."""

    def __init__(self, cfg: RunConfig, run_dir: RunDir, sinks: SinkSet | None,
                 samples: SampleLog, say: Callable[[str], None],
                 also: Callable[[StepRecord, dict[str, Any]], None] | None = None) -> None:
        from rollart_sdk.control.diagnostics import ActionWatch, MismatchWatch

        self.cfg = cfg
        self.run_dir = run_dir
        self.sinks = sinks
        self.samples = samples
        self.say = say
        self.also = also
        self.watch = ActionWatch()
        self.mismatch = MismatchWatch()
        self.display: Any = None  # until show()
        self._said_no_signal: set[str] = set()

    @classmethod
    def for_run(cls, cfg: RunConfig, run_dir: RunDir, tasks: dict[str, TaskRuntime],
                chat: ChatFormat, sinks: SinkSet | None, say: Callable[[str], None],
                also: Callable[[StepRecord, dict[str, Any]], None] | None = None
                ) -> StepReports:
        from rollart_sdk.control.samples import sample_log

        return cls(cfg, run_dir, sinks, sample_log(cfg, run_dir.path, tasks, chat), say, also)

    @property
    def finish_readers(self) -> tuple[Callable[[Trajectory], None], ...]:
        return (self.samples.finished,)

    def show(self, display: Any, steps: int) -> None:
        """Report from now on, on ``display``, for a run of ``steps`` steps (the sample
        log spreads its budget over them)."""
        self.display = display
        self.samples.steps = steps
        if self.sinks is not None:
            self.sinks.warn = display.warn

    def step(self, rec: StepRecord, metrics: dict[str, Any]) -> None:
        display = self.display
        if display is not None:
            self.run_dir.log_metrics(metrics)
            for line in no_signal_warnings(rec, self.cfg, self._said_no_signal):
                display.warn(line)
            self.samples.step(rec)
            if self.sinks is not None:
                self.sinks.step(metrics, self.samples.last)
            for line in (*self.watch.check(metrics), *self.mismatch.check(metrics)):
                display.warn(line)
            display.update(metrics)
        if self.also is not None:
            self.also(rec, metrics)

    def eval(self, line: dict[str, Any]) -> None:
        """Each held-out evaluation: its line in metrics.jsonl (``"kind": "eval"``) and a
        console line per task."""
        if self.display is None:
            return
        self.run_dir.log_metrics(line)
        if self.sinks is not None:  # the metric sinks get eval/<tag>/... too
            self.sinks.step(line)
        for tag in sorted({k.split("/")[1] for k in line if k.startswith("eval/") and
                           k.count("/") == 2}):
            succ, rew = line[f"eval/{tag}/success"], line[f"eval/{tag}/reward"]
            self.say(
                f"eval after {line['step']} steps: {tag} success "
                f"{'n/a' if succ is None else f'{succ:.3f}'}, reward "
                f"{'n/a' if rew is None else f'{rew:.3f}'} "
                f"({line[f'eval/{tag}/episodes']} episodes)")


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
