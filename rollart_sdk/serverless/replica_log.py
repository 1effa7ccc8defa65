"""Each reward replica's own record of its life: reserved time and busy time (paper R3).

A replica (a Ray Serve replica of ``serve_app.RewardFunction``) given a directory appends
JSON lines to ``replica-<id>.jsonl`` there:

- ``{"event": "created", "t": ...}`` when its constructor starts (the replica is reserved
  from here: a cold start's model load counts as reserved, not busy);
- ``{"event": "ready", "t": ...}`` when the backend is warmed up (model loaded);
- ``{"event": "busy", "t0": ..., "t1": ..., "calls": n}`` for every interval with at least
  one call in flight (n calls began in it);
- ``{"event": "alive", "t": ...}`` every ``heartbeat_s`` (the end of reserved time if the
  replica dies without a word);
- ``{"event": "closed", "t": ...}`` when Serve stops it (scale-down, deletion).

Times are wall-clock (``time.time()``) so logs from several processes line up.
:func:`read_usage` turns a directory of such logs into per-replica busy/reserved seconds:
replica utilisation is busy time over reserved time.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class ReplicaLog:
    """Appends one replica's events; a heartbeat thread marks it alive."""

    def __init__(self, directory: str | os.PathLike[str], heartbeat_s: float = 1.0) -> None:
        self.replica_id = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        Path(directory).mkdir(parents=True, exist_ok=True)
        self.path = Path(directory) / f"replica-{self.replica_id}.jsonl"
        self._lock = threading.Lock()
        self._file = open(self.path, "a", encoding="utf-8")
        self._inflight = 0
        self._calls = 0
        self._busy_since = 0.0
        self._stop = threading.Event()
        self.write("created")
        self._thread = threading.Thread(target=self._beat, args=(heartbeat_s,),
                                        name=f"replica-log-{self.replica_id}", daemon=True)
        self._thread.start()

    def write(self, event: str, **fields: Any) -> None:
        line = json.dumps({"event": event, "t": time.time(), **fields})
        with self._lock:
            if not self._file.closed:
                self._file.write(line + "\n")
                self._file.flush()

    def begin(self) -> None:
        """A call starts (calls on one event loop: no lock needed for the counters)."""
        if self._inflight == 0:
            self._busy_since = time.time()
            self._calls = 0
        self._inflight += 1
        self._calls += 1

    def end(self) -> None:
        self._inflight -= 1
        if self._inflight == 0:
            self.write("busy", t0=self._busy_since, t1=time.time(), calls=self._calls)

    def _beat(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            self.write("alive")

    def close(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        if self._inflight:  # stopped mid-call: the open interval is busy time too
            self.write("busy", t0=self._busy_since, t1=time.time(), calls=self._calls)
            self._inflight = 0
        self.write("closed")
        with self._lock:
            self._file.close()


@dataclass
class ReplicaUsage:
    """One replica's life from its own log (wall-clock seconds)."""

    replica_id: str
    created: float
    ready: float | None
    ended: float  # "closed", else the last heartbeat or event
    closed: bool  # False: the log stops without "closed" (killed); ended is its last sign
    busy_s: float
    calls: int
    last_busy: float | None = None  # when its last busy interval ended (None: never busy)

    @property
    def reserved_s(self) -> float:
        return max(0.0, self.ended - self.created)

    @property
    def start_up_s(self) -> float | None:
        return None if self.ready is None else self.ready - self.created

    def breakdown(self) -> dict[str, float]:
        """Where the reserved time went; the four parts sum to ``reserved_s``:
        ``start_up_s`` (created -> ready: the cold start), ``busy_s`` (>= 1 call in flight),
        ``idle_s`` (ready, no call, before its last call ended), ``tail_s`` (from its last
        call, or from ready when it never served, to its end: the idle tail before
        scale-down)."""
        ready = self.ready if self.ready is not None else self.ended
        start_up = max(0.0, min(ready, self.ended) - self.created)
        served_until = max(ready, self.last_busy or ready)
        serving = max(0.0, min(served_until, self.ended) - min(ready, self.ended))
        busy = min(self.busy_s, serving) if self.ready is not None else self.busy_s
        return {"start_up_s": start_up, "busy_s": busy, "idle_s": max(0.0, serving - busy),
                "tail_s": max(0.0, self.ended - max(served_until, self.created))}


def read_usage(directory: str | os.PathLike[str]) -> list[ReplicaUsage]:
    """Every replica log under ``directory``, oldest first."""
    out = []
    for path in sorted(Path(directory).glob("replica-*.jsonl")):
        events = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
                  if line.strip()]
        if not events or events[0]["event"] != "created":
            raise ValueError(f"{path}: a replica log starts with a 'created' event")
        busy = [e for e in events if e["event"] == "busy"]
        closed = [e["t"] for e in events if e["event"] == "closed"]
        ready = [e["t"] for e in events if e["event"] == "ready"]
        last = max([e["t"] for e in events] + [e["t1"] for e in busy])
        out.append(ReplicaUsage(
            replica_id=path.stem.removeprefix("replica-"), created=events[0]["t"],
            ready=ready[0] if ready else None, ended=closed[0] if closed else last,
            closed=bool(closed), busy_s=sum(e["t1"] - e["t0"] for e in busy),
            calls=sum(int(e["calls"]) for e in busy),
            last_busy=max(e["t1"] for e in busy) if busy else None,
        ))
    return sorted(out, key=lambda u: u.created)
