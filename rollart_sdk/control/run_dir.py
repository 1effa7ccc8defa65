"""The run directory: resolved config, metrics.jsonl, timeline events, checkpoints."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import yaml

from rollart_sdk.config import RunConfig


class RunDir:
    """Writes what a person (or `rollart report`) reads after a run."""

    def __init__(self, root: str | Path, config: RunConfig, name: str | None = None) -> None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.path = Path(root) / f"{name or config.name}-{stamp}"
        n = 1
        while self.path.exists():
            n += 1
            self.path = Path(root) / f"{name or config.name}-{stamp}-{n}"
        self.path.mkdir(parents=True)
        (self.path / "config.yaml").write_text(
            yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
        )
        self._metrics = open(self.path / "metrics.jsonl", "a", buffering=1)
        self._events = open(self.path / "events.jsonl", "a")
        self._pending_events = 0

    @property
    def checkpoints(self) -> Path:
        p = self.path / "checkpoints"
        p.mkdir(exist_ok=True)
        return p

    def log_metrics(self, metrics: dict[str, Any]) -> None:
        self._metrics.write(json.dumps(metrics, default=_jsonable) + "\n")

    def log_event(self, event: dict[str, Any]) -> None:
        """One span of the timeline: trajectory, tag, span, worker, t0, t1 (epoch s)."""
        self._events.write(json.dumps(event, default=_jsonable) + "\n")
        self._pending_events += 1
        if self._pending_events >= 256:
            self._events.flush()
            self._pending_events = 0

    def write_json(self, name: str, data: Any) -> Path:
        p = self.path / name
        p.write_text(json.dumps(data, indent=2, default=_jsonable))
        return p

    def close(self) -> None:
        self._metrics.close()
        self._events.close()


def _jsonable(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return obj.item()
    return str(obj)
