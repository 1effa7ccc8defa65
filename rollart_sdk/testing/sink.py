"""Conformance kit for metric sinks.

Call it from a plugin's tests with the sink's factory, then read back what it wrote with
the backend's own reader and compare with what the kit sent::

    from rollart_sdk.testing.sink import check_sink

    def test_conforms(tmp_path):
        sent = check_sink(MySink, tmp_path)
        assert read_my_store(tmp_path) == sent["metrics"]

Every failure is an ``AssertionError`` whose message starts with ``check_sink[<property>]``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["check_sink"]

# Two lines of samples.jsonl, as a sink's log_samples receives them.
SAMPLE_ROWS: list[dict[str, Any]] = [
    {"step": 2, "tag": "Arithmetic", "trajectory": "Arithmetic-g1-1", "group": "g1",
     "outcome": "trained", "dropped": None, "reward": 1.0,
     "turns": [{"turn": 1, "observation": "2+2=", "action": "4"}]},
    {"step": 2, "tag": "Arithmetic", "trajectory": "Arithmetic-g1-2", "group": "g1",
     "outcome": "dropped", "dropped": "env_step: boom", "reward": None,
     "turns": [{"turn": 1, "observation": "3+1=", "action": "x"}]},
]


def check_sink(factory: Callable[..., Any], run_dir: str | Path, steps: int = 3,
               **options: Any) -> dict[str, Any]:
    """Drive a sink as a run does: ``factory(run_dir=, run_name=, **options)``, the config,
    ``steps`` steps of metrics (keys with ``/``, integers and floats), the samples of the
    last step (when the sink has ``log_samples``), then ``close``. Returns what was sent:
    ``{"config": ..., "metrics": {key: [(step, value)]}, "run_name": ...}``."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    run_name = run_dir.name or "run"
    sink = factory(run_dir=str(run_dir), run_name=run_name, **options)
    for method in ("log_config", "log_metrics", "close"):
        assert callable(getattr(sink, method, None)), (
            f"check_sink[protocol]: {type(sink).__name__} has no {method}(); see "
            "rollart_sdk.interfaces.MetricSink")
    config = {"name": run_name, "rollout": {"batch_size": 8, "mode": "async"},
              "tasks": [{"tag": "Arithmetic"}]}
    sink.log_config(config)
    sent: dict[str, list[tuple[int, float]]] = {}
    for step in range(1, steps + 1):
        metrics = {"reward/Arithmetic": 0.25 * step, "trajectories/trained": float(8 * step),
                   "train/loss": 1.0 / step, "staleness/hist/0": float(step % 2)}
        sink.log_metrics(step, metrics)
        for key, value in metrics.items():
            sent.setdefault(key, []).append((step, value))
        if step == steps and callable(getattr(sink, "log_samples", None)):
            sink.log_samples(step, [dict(r, step=step) for r in SAMPLE_ROWS])
    sink.close()
    return {"config": config, "metrics": sent, "run_name": run_name}
