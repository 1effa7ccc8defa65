"""Live progress of a run: step, rewards per task, staleness, throughput (rich)."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from rollart_sdk.config import RunConfig


class ProgressDisplay:
    def __init__(self, config: RunConfig, steps: int, enabled: bool = True) -> None:
        self.cfg = config
        self.steps = steps
        self.enabled = enabled
        self.console = Console(stderr=True)
        self.live: Live | None = None
        self.last: dict[str, Any] = {}
        self.t0 = time.time()

    def __enter__(self) -> ProgressDisplay:
        if self.enabled and self.console.is_terminal:
            self.live = Live(self._render(), console=self.console, refresh_per_second=4)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.live is not None:
            self.live.__exit__(*exc)

    def update(self, metrics: dict[str, Any]) -> None:
        self.last = metrics
        if self.live is not None:
            self.live.update(self._render())
        else:
            self.console.print(
                f"step {metrics['step']}/{self.steps}  {step_scores(metrics)}  "
                f"staleness<={metrics['staleness/max']}  trained={metrics['trajectories/trained']} "
                f"waste={metrics['rollout/waste']:.0%}  t={metrics['wall_time']:.0f}s",
                highlight=False, soft_wrap=True,
            )

    def warn(self, line: str) -> None:
        """A warning on the console (above the live table when there is one)."""
        self.console.print(f"warning: {line}", style="yellow", highlight=False,
                           soft_wrap=True)

    def _render(self) -> Table:
        m = self.last
        elapsed = time.time() - self.t0
        step = m.get("step", 0)
        t = Table(title=f"rollart train: {self.cfg.name}  [{self.cfg.rollout.mode}, "
                        f"alpha={self.cfg.rollout.alpha}]", show_header=False)
        t.add_row("step", f"{step}/{self.steps}")
        t.add_row("elapsed", f"{elapsed:.0f}s")
        for k, v in sorted(m.items()):
            if k.startswith(("reward/", "success/")):
                t.add_row(k, f"{v:.3f}")
        if m:
            t.add_row("staleness max/mean", f"{m['staleness/max']} / {m['staleness/mean']:.2f}")
            trained = m["trajectories/trained"]
            t.add_row("trajectories trained / dropped", f"{trained} / {m['trajectories/dropped']}")
            t.add_row("rollout waste (trajectories / tokens)",
                      f"{m['rollout/waste']:.0%} / {m['rollout/waste_tokens']:.0%}")
            t.add_row("throughput", f"{trained / max(elapsed, 1e-9):.1f} traj/s")
            t.add_row("get_batch wait / train / weight sync",
                      f"{m['time/get_batch_wait']:.2f}s / {m['time/train']:.2f}s / "
                      f"{m['time/weight_sync']:.3f}s")
        return t


def step_scores(metrics: dict[str, Any]) -> str:
    """The step line's per-task figures, named: ``reward A=0.69 B=0.04  success B=0.04``
    (mean reward of each task; success rate of the tasks whose env reports one, the
    figure the end-of-run summary prints)."""
    parts = []
    for kind in ("reward", "success"):
        vals = " ".join(f"{k.split('/', 1)[1]}={v:.2f}" for k, v in metrics.items()
                        if k.startswith(f"{kind}/"))
        if vals:
            parts.append(f"{kind} {vals}")
    return "  ".join(parts)
