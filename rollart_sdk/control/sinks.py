"""The run's metric sinks (``logging:``): each gets the config once and every step's
metrics beside ``metrics.jsonl``, and the step's samples when it can show them.

A sink is a plugin (kind ``sink``): TensorBoard, MLflow, W&B... Its library can fail
(a bug, a full disk, a lost service): that must never stop training. Every call is
guarded: the first failure of a sink is said on the console, every failure is counted
(``summary.json``'s ``sinks``), and the sink keeps getting the next steps (a full disk
may clear). A sink that fails to start is left out for the run.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rollart_sdk.config.resolve import Resolved


def flatten_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """The numeric figures of one metrics line: numbers and booleans as floats, a dict
    (``staleness/hist``) one level down as ``key/sub``; text, ``None`` and NaN left out.
    ``step`` is left out too: it is the step the figures are logged at."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if key == "step":
            continue
        if isinstance(value, dict):
            for sub, v in value.items():
                _put(out, f"{key}/{sub}", v)
        else:
            _put(out, key, value)
    return out


def _put(out: dict[str, float], key: str, value: Any) -> None:
    if isinstance(value, (bool, int, float)) and not isinstance(value, str):
        f = float(value)
        if math.isfinite(f):
            out[key] = f


@dataclass
class _Sink:
    name: str
    sink: Any
    errors: int = 0
    first_error: str | None = None


@dataclass
class SinkSet:
    """The started sinks of a run; ``warn`` says a sink's first failure (console; the
    line comes without a ``warning:`` prefix)."""

    sinks: list[_Sink] = field(default_factory=list)
    warn: Callable[[str], None] = print
    failed_to_start: dict[str, str] = field(default_factory=dict)
    closed: bool = False

    @classmethod
    def start(cls, resolved: list[Resolved], run_dir: str, run_name: str,
              config: dict[str, Any], warn: Callable[[str], None] = print) -> SinkSet:
        """Create every sink and give it the config; one that fails is left out."""
        out = cls(warn=warn)
        for res in resolved:
            name = res.descriptor.name
            try:
                sink = res.create(run_dir=run_dir, run_name=run_name)
            except Exception as exc:  # noqa: BLE001 - a sink never stops the run
                why = f"{type(exc).__name__}: {exc}"[:1000]
                out.failed_to_start[name] = why
                warn(f"metric sink {name!r} did not start ({why}); the run goes "
                     "on without it (metrics.jsonl has every step)")
                continue
            out.sinks.append(_Sink(name, sink))
        out._each("log_config", config)
        return out

    def _each(self, method: str, *args: Any) -> None:
        for s in self.sinks:
            fn = getattr(s.sink, method, None)
            if fn is None:
                continue
            try:
                fn(*args)
            except Exception as exc:  # noqa: BLE001 - counted, said once; the run goes on
                s.errors += 1
                if s.first_error is None:
                    s.first_error = f"{method}: {type(exc).__name__}: {exc}"[:1000]
                    self.warn(f"metric sink {s.name!r} failed in {method} "
                              f"({type(exc).__name__}: {exc}); the run goes on, its "
                              "failures are counted in summary.json (sinks)")

    def step(self, metrics: dict[str, Any], samples: list[dict[str, Any]] | None = None) -> None:
        """One trained step: its metrics line (and the samples written for it)."""
        step = int(metrics["step"])
        self._each("log_metrics", step, flatten_metrics(metrics))
        if samples:
            self._each("log_samples", step, samples)

    def close(self) -> None:
        """Close every sink (once: later calls do nothing)."""
        if self.closed:
            return
        self.closed = True
        self._each("close")

    def summary(self) -> dict[str, Any]:
        """Per sink: errors counted, the first one; a sink that did not start, why."""
        out: dict[str, Any] = {s.name: {"errors": s.errors, "first_error": s.first_error}
                               for s in self.sinks}
        for name, why in self.failed_to_start.items():
            out[name] = {"errors": 1, "first_error": f"start: {why}", "started": False}
        return out


def sample_text(row: dict[str, Any], max_chars: int = 4000) -> str:
    """One line of ``samples.jsonl`` as Markdown (a sink's text view): the task, outcome
    and reward, then each turn's observation and action as the model saw them; cut to
    ``max_chars``."""
    head = (f"**{row.get('tag')}** · {row.get('outcome')}"
            + (f" ({row.get('dropped')})" if row.get("dropped") else "")
            + f" · reward {row.get('reward')} · trajectory {row.get('trajectory')}")
    parts = [head]
    for turn in row.get("turns", []):
        parts.append(f"turn {turn.get('turn')}:")
        for what in ("observation", "action"):
            text = str(turn.get(what, "")).replace("```", "'''")
            parts.append(f"{what}:\n```\n{text}\n```")
    out = "\n\n".join(parts)
    return out if len(out) <= max_chars else out[: max_chars - 3] + "..."
