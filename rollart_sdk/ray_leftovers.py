"""The processes of a local Ray whose driver was killed: recorded at start, stopped by the
next start.

A driver that starts its own local Ray (``init_ray`` without an address) is the parent of
Ray's GCS and raylet, which start Ray's agents and workers. When the driver is SIGKILLed
(kill -9, the OOM killer) the GCS, the raylet and the workers die with it within seconds,
but ``ray::DashboardAgent`` and ``ray::RuntimeEnvAgent`` live on for about a minute (each
notices that its raylet died, then tries for 60 s to report it to the dead GCS). Meanwhile
they hold memory and the dashboard agent's fixed port (52365), so the next local Ray's
agent first fails to bind it; on a loaded machine its raylet then gives up waiting for the
agent ("The current node timed out during startup") and the resumed run does not start.

So each driver records, right after its local Ray is up, every process below it (PID and
start time, from /proc) in a small JSON file; a clean exit removes the file. The next
local start reads the records of drivers that are gone and SIGKILLs those of their
processes that are still alive, matched by PID *and* start time (a PID reused by another
process is never touched). Only processes this user's earlier drivers started are
considered; another user's, or a running driver's, are left alone. Linux only (reads
/proc); elsewhere nothing is recorded.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import tempfile
from pathlib import Path
from typing import Any

RECORDS_ENV = "ROLLART_RAY_RECORDS"  # where the records live (tests point it elsewhere)


def records_dir() -> Path:
    """The folder of this user's records (``$ROLLART_RAY_RECORDS``, else
    ``$TMPDIR/rollart-<uid>/local-ray``)."""
    where = os.environ.get(RECORDS_ENV)
    if where:
        return Path(where)
    return Path(tempfile.gettempdir()) / f"rollart-{os.getuid()}" / "local-ray"


def start_time(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot (field 22 of /proc/PID/stat);
    None when there is no such process, or only its zombie. With the PID it names one
    process for good."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return None if fields[0] in ("Z", "X") else int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def record(pid: int | None = None) -> Path | None:
    """Record the processes below ``pid`` (default: this process, the driver); removed
    again when this process exits normally. The record's path, or None off Linux."""
    pid = os.getpid() if pid is None else pid
    me = start_time(pid)
    if me is None:
        return None
    procs = [[p, t, cmd[:200]] for p, cmd in descendants(pid).items()
             if (t := start_time(p)) is not None]
    folder = records_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"driver-{pid}-{me}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"driver": [pid, me], "processes": procs}))
    tmp.replace(path)
    if pid == os.getpid():
        atexit.register(path.unlink, missing_ok=True)
    return path


def _alive(pid: int, started: int) -> bool:
    return start_time(pid) == started


def stop_leftovers() -> list[str]:
    """SIGKILL what is still alive of the local Rays of drivers that are gone, and remove
    their records. Returns one description per process stopped (``PID title``)."""
    folder = records_dir()
    if not folder.is_dir():
        return []
    stopped: list[str] = []
    for path in sorted(folder.glob("driver-*.json")):
        try:
            rec: dict[str, Any] = json.loads(path.read_text())
            driver = rec["driver"]
        except (OSError, ValueError, KeyError):
            path.unlink(missing_ok=True)  # torn or foreign: nothing can be matched
            continue
        if _alive(*driver):
            continue  # a running driver's cluster
        for pid, started, title in rec.get("processes", []):
            if _alive(pid, started):
                try:
                    os.kill(pid, signal.SIGKILL)
                    stopped.append(f"{pid} {title.split(' ', 1)[0]}")
                except (ProcessLookupError, PermissionError):
                    pass
        path.unlink(missing_ok=True)
    return stopped


def _is_ray(cmd: str) -> bool:
    return cmd.startswith("ray::") or "/site-packages/ray/" in cmd


def stop_ray_below(pid: int) -> list[str]:
    """SIGKILL the Ray processes below ``pid`` (GCS, raylet, agents, workers: a command
    line from Ray's package or a ``ray::`` title); for a local start that failed half-way.
    Returns one description per process stopped."""
    stopped = []
    for p, cmd in descendants(pid).items():
        if _is_ray(cmd):
            try:
                os.kill(p, signal.SIGKILL)
                stopped.append(f"{p} {cmd.split(' ', 1)[0]}")
            except (ProcessLookupError, PermissionError):
                pass
    return stopped


def descendants(pid: int) -> dict[int, str]:
    """Every process below ``pid`` with its command line (arguments joined by spaces), read
    from /proc (Linux); a process that ends while it is read is left out, with its own
    descendants."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # ended between the listing and the read
        children.setdefault(ppid, []).append(int(d.name))
    out: dict[int, str] = {}
    todo = [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            try:
                cmdline = Path(f"/proc/{c}/cmdline").read_bytes().rstrip(b"\0")
            except OSError:
                continue
            out[c] = cmdline.replace(b"\0", b" ").decode(errors="replace")
            todo.append(c)
    return out
