"""The run directory: resolved config, metrics.jsonl, timeline events, drops, checkpoints.

Bounded on disk: ``events.jsonl`` stops at ``MAX_EVENT_BYTES`` (one ``truncated`` line
says so), ``drops.jsonl`` (every dropped trajectory with its reason and exception text)
at ``MAX_DROP_LINES`` lines. Events are flushed every 256 lines or 2 seconds.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from rollart_sdk import durable
from rollart_sdk.config import RunConfig
from rollart_sdk.errors import RollartError

MAX_EVENT_BYTES = 200 * 2**20
MAX_DROP_LINES = 20_000


class RunDir:
    """Writes what a person (or `rollart report`) reads after a run."""

    def __init__(self, root: str | Path, config: RunConfig, name: str | None = None,
                 resume: Path | None = None) -> None:
        if resume is not None:  # --resume: the same folder; every log is appended to
            self.path = Path(resume)
        else:
            stamp = time.strftime("%Y%m%d-%H%M%S")
            self.path = Path(root) / f"{name or config.name}-{stamp}"
            n = 1
            while self.path.exists():
                n += 1
                self.path = Path(root) / f"{name or config.name}-{stamp}-{n}"
            self.path.mkdir(parents=True)
            durable.write_text(self.path / "config.yaml", yaml.safe_dump(
                config.model_dump(mode="json"), sort_keys=False))
        self._metrics = open(self.path / "metrics.jsonl", "a", buffering=1)
        self._events = open(self.path / "events.jsonl", "a")
        self._pending_events = 0
        self._event_bytes = (self.path / "events.jsonl").stat().st_size  # resume: so far
        self._last_flush = time.monotonic()
        self.events_dropped = 0  # events past MAX_EVENT_BYTES, not written
        self._drops = open(self.path / "drops.jsonl", "a", buffering=1)
        self._drop_lines = _count_lines(self.path / "drops.jsonl")
        self.drop_examples: dict[str, str] = {}  # reason -> first full text seen
        self.close_errors: Counter[str] = Counter()

    @property
    def checkpoints(self) -> Path:
        p = self.path / "checkpoints"
        p.mkdir(exist_ok=True)
        return p

    def log_metrics(self, metrics: dict[str, Any]) -> None:
        try:
            self._metrics.write(dumps(metrics) + "\n")
        except OSError as exc:  # a full disk: the run stops, saying where and what to do
            raise RollartError(
                f"cannot write {self.path / 'metrics.jsonl'}: {exc}; free space (or fix the "
                "permissions) there, then continue the run with --resume") from exc

    def log_event(self, event: dict[str, Any]) -> None:
        """One span of the timeline: trajectory, tag, span, worker, t0, t1 (epoch s)."""
        if self._events.closed:
            return
        if self._event_bytes >= MAX_EVENT_BYTES:
            if not self.events_dropped:
                self._events.write(json.dumps({"truncated": True, "t0": time.time(),
                                               "max_bytes": MAX_EVENT_BYTES}) + "\n")
                self._events.flush()
            self.events_dropped += 1
            return
        line = span_line(event) or dumps(event) + "\n"
        self._events.write(line)
        self._event_bytes += len(line)
        self._pending_events += 1
        now = time.monotonic()
        if self._pending_events >= 256 or now - self._last_flush > 2.0:
            self._events.flush()
            self._pending_events = 0
            self._last_flush = now

    def log_finished(self, traj: Any) -> None:
        """A finished trajectory: an env close error is counted (drops are written by
        :meth:`log_drop`, when the buffer counts them)."""
        close_err = traj.info.get("env_close_error") if traj.info else None
        if close_err:
            self.close_errors[str(close_err).split(":", 1)[0]] += 1
            if traj.dropped is None:
                self._write_drop_line(traj, "env_close_error", "", close_err)

    def log_drop(self, traj: Any) -> None:
        """A trajectory counted dropped (the buffer's ``on_drop``, whatever decided it:
        its failure, its group's, dynamic sampling, staleness, the run's end): one line of
        drops.jsonl with its reason (the exception text included, bounded)."""
        assert traj.dropped is not None
        key = traj.dropped.split(": ", 1)[0]
        self.drop_examples.setdefault(key, traj.dropped[:1000])
        close_err = traj.info.get("env_close_error") if traj.info else None
        self._write_drop_line(traj, key, traj.dropped, close_err)

    def _write_drop_line(self, traj: Any, key: str, text: str, close_err: Any) -> None:
        if self._drops.closed or self._drop_lines >= MAX_DROP_LINES:
            return
        self._drop_lines += 1
        self._drops.write(json.dumps({
            "t": round(time.time(), 3), "trajectory": traj.trajectory_id, "tag": traj.tag,
            "group": traj.group_id, "reason": key, "text": text[:1000],
            **({"env_close_error": str(close_err)[:1000]} if close_err else {}),
        }) + "\n")

    def write_json(self, name: str, data: Any) -> Path:
        """Replace ``name`` atomically: a crash or a full disk leaves the previous file."""
        p = self.path / name
        durable.write_text(p, dumps(data, indent=2))
        return p

    def rollback_metrics(self, step: int) -> int:
        """``--resume`` loaded the checkpoint of ``step`` steps: the lines past it move to
        metrics.rolledback.jsonl (control/resume.py); returns how many moved."""
        from rollart_sdk.control.resume import rollback_metrics

        self._metrics.close()
        try:
            return rollback_metrics(self.path, step)
        finally:  # the file was replaced: append to the new one
            self._metrics = open(self.path / "metrics.jsonl", "a", buffering=1)

    def close(self) -> None:
        """Close the logs; a full disk on the last flush is said in one line (the run's own
        error, if any, stays the error)."""
        for f in (self._metrics, self._events, self._drops):
            try:
                f.close()
            except OSError as exc:
                print(f"warning: the end of {f.name} was not written ({exc})", file=sys.stderr)


def _count_lines(path: Path) -> int:
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def _jsonable(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return _finite(obj.item())
    return str(obj)


def _finite(obj: Any) -> Any:
    """``obj`` with every NaN or infinite float replaced by None (JSON has no NaN: a
    metric over no sample, e.g. the entropy of a step whose samples all had advantage 0,
    is written as ``null``, which every JSON reader parses)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


_SPAN_KEYS = ("trajectory", "tag", "span", "worker", "t0", "t1")
_quote = json.encoder.encode_basestring_ascii  # json.dumps's own string encoder (in C)


def span_line(event: dict[str, Any]) -> str | None:
    """A timeline span's line, exactly as ``dumps(event) + "\\n"`` writes it, without the
    generic walk: every turn of every trajectory writes two or three of these, and the
    walk (a copy of the dict, then the encoder) was a tenth of the driver's CPU per turn
    (``rollart bench driver``). None for any other event (the caller then uses
    :func:`dumps`)."""
    if len(event) != 6 or tuple(event) != _SPAN_KEYS:
        return None
    traj, tag, span, worker, t0, t1 = event.values()
    if (type(t0) is not float or type(t1) is not float or not math.isfinite(t0)
            or not math.isfinite(t1) or type(tag) is not str or type(span) is not str
            or type(worker) is not str or (traj is not None and type(traj) is not str)):
        return None
    return (f'{{"trajectory": {"null" if traj is None else _quote(traj)}, "tag": {_quote(tag)}, '
            f'"span": {_quote(span)}, "worker": {_quote(worker)}, "t0": {t0!r}, "t1": {t1!r}}}\n')


def dumps(obj: Any, **kw: Any) -> str:
    """Strict JSON of a run's record (``null`` for NaN / infinity; tensors and numpy
    scalars as numbers; anything else as its text)."""
    return json.dumps(_finite(obj), default=_jsonable, allow_nan=False, **kw)
