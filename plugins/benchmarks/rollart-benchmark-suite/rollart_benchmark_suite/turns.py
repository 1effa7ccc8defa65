"""``rollart bench turns``: what one turn of a multi-turn episode costs, per layout.

The ``rollart bench small`` workload (FrozenLake, 8 groups x 8 episodes, at most 8 turns,
sync) for ``--steps`` steps in each ``--layouts`` (``inprocess``: every worker in the
driver's process; ``ray``: one Ray actor per role), each in a fresh process. Measured
there, and independent of the machine's load (counts and CPU seconds, not wall time):

- every call the control plane makes to a worker (``WorkerHandle.call``/``submit``), by
  method: how many, and on Ray the bytes pickled for its arguments and its result (the
  size of ``cloudpickle.dumps``: what crosses the process boundary; the measuring's own
  CPU is subtracted from the driver's);
- CPU seconds (user + system) from the first step to the last of the driver (the control
  plane and, in process, every worker) and, on Ray, of each worker process (by its
  ``ray::Class`` title) and of Ray's own daemons (GCS, raylet, ...);
- turns (``generate`` calls), trajectories and steps, so that each figure is also given
  per turn.

``--env-host`` sets ``tasks[].env_host`` (the workload's is ``inline``; ``worker`` puts the
envs in the environment role's processes: one more call per turn). ``--profile N``: the
driver's N most expensive functions (cProfile of its event loop thread).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

_MODULE = "rollart_benchmark_suite.turns"
# The engines' counters reported (summed over engines): forward steps, tokens computed.
ENGINE_COUNTS = ("steps", "inline_steps", "tokens_generated", "prefill_tokens",
                 "reused_tokens", "shared_tokens", "step_seconds")


class CallMeter:
    """Counts the control plane's worker calls by method, and on Ray their pickled bytes
    (arguments, result). Installed on :class:`WorkerHandle` for one run (:meth:`install`)."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = defaultdict(int)
        self.arg_bytes: dict[str, int] = defaultdict(int)
        self.result_bytes: dict[str, int] = defaultdict(int)
        self.max_arg_bytes: dict[str, int] = defaultdict(int)
        self.items: dict[str, int] = defaultdict(int)  # requests in a batched call
        self.ray: set[str] = set()  # methods called on Ray actors (the others in process)
        self.own_cpu_s = 0.0  # the measuring's own CPU (pickling for the sizes)
        self._saved: tuple[Any, Any, Any] | None = None

    def _size(self, obj: Any) -> int:
        from ray import cloudpickle

        t0 = time.thread_time()
        try:
            return len(cloudpickle.dumps(obj, protocol=5))
        except Exception:  # noqa: BLE001 - e.g. an ObjectRef list: counted as 0
            return 0
        finally:
            self.own_cpu_s += time.thread_time() - t0

    def _sent(self, method: str, ray: bool, args: tuple[Any, ...]) -> None:
        self.calls[method] += 1
        if ray:
            self.ray.add(method)
            n = self._size(args)
            self.arg_bytes[method] += n
            self.max_arg_bytes[method] = max(self.max_arg_bytes[method], n)

    def install(self) -> None:
        from rollart_sdk.cluster.handles import WorkerHandle

        # (no ``stream`` before the batched calls: the bench measures that code too)
        meter, call, submit, stream = (self, WorkerHandle.call, WorkerHandle.submit,
                                       getattr(WorkerHandle, "stream", None))
        self._saved = (call, submit, stream)

        async def metered_call(handle: WorkerHandle, method: str, *args: Any,
                               **kwargs: Any) -> Any:
            meter._sent(method, handle.is_ray, args)
            result = await call(handle, method, *args, **kwargs)
            if handle.is_ray:
                meter.result_bytes[method] += meter._size(result)
            return result

        def metered_submit(handle: WorkerHandle, method: str, *args: Any) -> Any:
            meter._sent(method, handle.is_ray, args)
            return submit(handle, method, *args)

        async def metered_stream(handle: WorkerHandle, method: str, *args: Any) -> Any:
            meter._sent(method, handle.is_ray, args)
            meter.items[method] += len(args[0]) if args and isinstance(args[0], list) else 1
            assert stream is not None
            async for item in stream(handle, method, *args):
                if handle.is_ray:
                    meter.result_bytes[method] += meter._size(item)
                yield item

        setattr(WorkerHandle, "call", metered_call)  # noqa: B010 - for this run only
        setattr(WorkerHandle, "submit", metered_submit)  # noqa: B010
        if stream is not None:
            setattr(WorkerHandle, "stream", metered_stream)  # noqa: B010

    def uninstall(self) -> None:
        from rollart_sdk.cluster.handles import WorkerHandle

        if self._saved is not None:
            for name, fn in zip(("call", "submit", "stream"), self._saved, strict=True):
                if fn is not None:
                    setattr(WorkerHandle, name, fn)
            self._saved = None

    def to_json(self) -> dict[str, dict[str, int]]:
        return {m: {"calls": n, "requests": self.items.get(m, n), "ray": m in self.ray,
                    "arg_bytes": self.arg_bytes[m],
                    "result_bytes": self.result_bytes[m],
                    "max_arg_bytes": self.max_arg_bytes[m]}
                for m, n in sorted(self.calls.items())}


def ray_processes() -> dict[int, str]:
    """pid -> what it is, for every process of this driver's local Ray: its daemons
    (``gcs_server``, ``raylet``, ...) and the raylet's workers (``ray::Class`` titles)."""
    import psutil
    from ray._private import worker

    node = worker._global_node
    out: dict[int, str] = {}
    if node is None:
        return out
    for kind, infos in node.all_processes.items():
        for info in infos:
            out[info.process.pid] = f"daemon:{kind}"
            try:
                for child in psutil.Process(info.process.pid).children(recursive=True):
                    out.setdefault(child.pid, "")
            except psutil.Error:
                continue
    return out


def _title(pid: int) -> str:
    import psutil

    try:
        cmd = psutil.Process(pid).cmdline()
    except psutil.Error:
        return "gone"
    head = (cmd[0] if cmd else "").split()[0] if cmd and cmd[0] else ""
    if head.startswith("ray::"):
        return head.split(".")[0]  # ray::EngineWorker (a method suffix while busy)
    return os.path.basename(head) or "?"


def threads_of(pids: dict[int, str]) -> dict[str, float]:
    """CPU seconds by ``process title/thread name`` (``/proc/PID/task/TID/comm``), for the
    workers' processes: where in a worker the time goes (its event loop, Ray's threads,
    torch's)."""
    import psutil

    out: dict[str, float] = defaultdict(float)
    for pid, kind in pids.items():
        if kind:  # a daemon: its total is enough
            continue
        try:
            title = _title(pid)
            for t in psutil.Process(pid).threads():
                try:
                    name = Path(f"/proc/{pid}/task/{t.id}/comm").read_text().strip()
                except OSError:
                    name = "?"
                out[f"{title}/{name}"] += t.user_time + t.system_time
        except psutil.Error:
            continue
    return out


def cpu_of(pids: dict[int, str]) -> dict[int, float]:
    import psutil

    out = {}
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            out[pid] = t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            continue
    return out


def _config(layout: str, seed: int, steps: int, tmp: str, env_host: str | None) -> Any:
    from rollart_benchmark_suite.small import workload_config

    data = workload_config("sync", "none", seed, tmp, steps, layout)
    if env_host is not None:
        data["tasks"][0]["env_host"] = env_host
    return data


def child(layout: str, steps: int, seed: int, env_host: str | None, profile: int,
          out: str) -> None:
    """One run in this process; writes its figures as JSON to ``out``."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from rollart_benchmark_suite.small import _registry
    from rollart_sdk.config import load_config
    from rollart_sdk.job import build_job

    registry = _registry()
    meter = CallMeter()
    with tempfile.TemporaryDirectory(prefix="rollart-bench-turns-") as tmp:
        cfg, lines = load_config(data=_config(layout, seed, steps, tmp, env_host))
        successes: list[float] = []
        trajectories = [0]

        def on_step(rec: Any, m: dict[str, Any]) -> None:
            successes.append(m.get("success/FrozenLake", 0.0))
            trajectories[0] += len(rec.batch)

        job = build_job(cfg, lines, in_process=layout == "inprocess", log=lambda *a: None,
                        registry=registry, on_step=on_step)
        try:
            res = _measure(job, steps, meter, profile, successes, trajectories)
        finally:
            meter.uninstall()
            job.run_dir.close()
            job.close()
            if layout == "ray":
                import ray

                ray.shutdown()
    res.update(layout=layout, seed=seed, env_host=env_host or "inline")
    Path(out).write_text(json.dumps(res))


def _measure(job: Any, steps: int, meter: CallMeter, profile: int, successes: list[float],
             trajectories: list[int]) -> dict[str, Any]:
    """Run ``steps`` steps and measure them; ``successes`` and ``trajectories`` are filled
    by the job's ``on_step`` (``child``)."""
    import cProfile
    import io
    import pstats

    pids = ray_processes() if any(h.is_ray for h in job.trainers) else {}
    prof = cProfile.Profile() if profile else None
    meter.install()
    cpu0, workers0, threads0 = time.process_time(), cpu_of(pids), threads_of(pids)
    if prof is not None:
        prof.enable()
    asyncio.run(job.pipeline.run(steps))
    if prof is not None:
        prof.disable()
    driver = time.process_time() - cpu0 - meter.own_cpu_s
    workers1, threads1 = cpu_of(pids), threads_of(pids)
    meter.uninstall()
    engines = [job.spawner.call(w, "stats", timeout=60)
               for w in job.pipeline.proxy.workers.values()]
    by_title: dict[str, float] = defaultdict(float)
    for pid, t in workers1.items():
        by_title[pids[pid] or _title(pid)] += t - workers0.get(pid, 0.0)
    res: dict[str, Any] = {
        "steps": len(successes), "success_per_step": successes,
        "trained_trajectories": trajectories[0], "calls": meter.to_json(),
        "driver_cpu_s": round(driver, 3), "measuring_cpu_s": round(meter.own_cpu_s, 3),
        "workers_cpu_s": {k: round(v, 3) for k, v in sorted(by_title.items()) if v > 0},
        "threads_cpu_s": {k: round(v - threads0.get(k, 0.0), 3)
                          for k, v in sorted(threads1.items()) if v - threads0.get(k, 0.0) > 0.01},
        "engine": {k: sum(e.get(k, 0) for e in engines) for k in ENGINE_COUNTS},
    }
    if prof is not None:
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(profile)
        res["profile"] = buf.getvalue()
    return res


def per_turn(res: dict[str, Any]) -> dict[str, Any]:
    """The run's figures per turn (``generate`` call) and per call."""
    calls = res["calls"]
    turns = max(1, sum(calls.get(m, {}).get("requests", 0)
                       for m in ("generate", "generate_many")))
    workers = res["workers_cpu_s"]
    total = res["driver_cpu_s"] + sum(workers.values())
    gen = {k: sum(calls.get(m, {}).get(k, 0) for m in ("generate", "generate_many"))
           for k in ("calls", "arg_bytes", "result_bytes")}
    return {
        "turns": turns,
        "calls_per_turn": round(sum(c["calls"] for c in calls.values()) / turns, 2),
        "ray_calls_per_turn": round(sum(c["calls"] for c in calls.values() if c.get("ray"))
                                    / turns, 3),
        "generate_calls_per_turn": round(gen["calls"] / turns, 3),
        "generate_arg_bytes_per_turn": round(gen["arg_bytes"] / turns),
        "generate_result_bytes_per_turn": round(gen["result_bytes"] / turns),
        "bytes_per_turn": round(sum(c["arg_bytes"] + c["result_bytes"]
                                    for c in calls.values()) / turns),
        "driver_cpu_ms_per_turn": round(1000 * res["driver_cpu_s"] / turns, 3),
        "workers_cpu_ms_per_turn": {k: round(1000 * v / turns, 3) for k, v in workers.items()},
        "total_cpu_ms_per_turn": round(1000 * total / turns, 3),
    }


def run_one(layout: str, steps: int, seed: int, env_host: str | None,
            profile: int = 0) -> dict[str, Any]:
    """One layout in a fresh ``python`` process."""
    with tempfile.TemporaryDirectory(prefix="rollart-bench-turns-out-") as tmp:
        out = str(Path(tmp) / "run.json")
        proc = subprocess.run(
            [sys.executable, "-m", _MODULE, "--child", layout, str(steps), str(seed),
             env_host or "-", str(profile), out],
            capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            raise RuntimeError(f"bench turns ({layout}) failed:\n{proc.stderr[-3000:]}")
        res: dict[str, Any] = json.loads(Path(out).read_text())
    res["per_turn"] = per_turn(res)
    return res


def _print(res: dict[str, Any]) -> None:
    p = res["per_turn"]
    print(f"\n{res['layout']} (env_host {res['env_host']}): {res['steps']} steps, "
          f"{p['turns']} turns, {res['trained_trajectories']} trained trajectories; "
          f"success per step {res['success_per_step']}")
    print(f"  per turn: {p['calls_per_turn']} worker calls ({p['ray_calls_per_turn']} to Ray "
          f"actors), {p['bytes_per_turn']} bytes "
          f"pickled (generation: {p['generate_calls_per_turn']} calls, "
          f"{p['generate_arg_bytes_per_turn']} B out, "
          f"{p['generate_result_bytes_per_turn']} B back), CPU {p['total_cpu_ms_per_turn']} "
          f"ms: driver {p['driver_cpu_ms_per_turn']} ms"
          + "".join(f", {k} {v} ms" for k, v in p["workers_cpu_ms_per_turn"].items()))
    print(f"  {'method':<16} {'calls':>7} {'requests':>9} {'arg B/call':>11} "
          f"{'max arg B':>10} {'result B/call':>14}")
    for m, c in res["calls"].items():
        n = max(1, c["calls"])
        print(f"  {m:<16} {c['calls']:>7} {c['requests']:>9} {c['arg_bytes'] // n:>11} "
              f"{c['max_arg_bytes']:>10} {c['result_bytes'] // n:>14}")
    print(f"  engine: {res['engine']}")
    print(f"  worker threads' CPU s: {res['threads_cpu_s']}")
    if res.get("profile"):
        print(res["profile"])


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--child":
        layout, steps, seed, env_host, profile, out = argv[1:7]
        child(layout, int(steps), int(seed), None if env_host == "-" else env_host,
              int(profile), out)
        return 0
    parser = argparse.ArgumentParser(prog="rollart bench turns",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--layouts", nargs="+", default=["inprocess", "ray"],
                        choices=["inprocess", "ray"])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--env-host", default=None, choices=["inline", "thread", "worker"],
                        help="tasks[].env_host (default: the workload's, inline)")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="print the driver's N most expensive functions (cProfile)")
    parser.add_argument("--json", metavar="PATH", default=None)
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps {args.steps}: at least 1")
    load_before = os.getloadavg()
    rows = []
    for layout in args.layouts:
        res = run_one(layout, args.steps, args.seed, args.env_host, args.profile)
        _print(res)
        rows.append(res)
    print(f"\nload average (1, 5, 15 min) before {load_before}, after {os.getloadavg()}; "
          f"{os.cpu_count()} cores")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "benchmark": "turns", "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(), "rows": rows}, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
