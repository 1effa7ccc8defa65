"""``rollart bench driver``: what the driver (the control plane's process) spends per
trajectory, and whether that grows with the trajectories in flight (issue 35, item 5).

Two parts, each config run ``--repeats`` times, the median reported:

- ``send``: a batch of N trajectories (``--tokens`` tokens each, the four per-token lists
  of a ``TrainSample``) goes to 2 data-parallel ranks on a local Ray, the way
  ``Pipeline._train`` sends it: ``args`` (before: each rank's shard pickled as the actor
  call's argument) against ``refs`` (now: ``shard_batch`` puts each shard into the object
  store once and sends a ``ShardRef``; the rank fetches it, cluster/shards.py). The ranks
  are light actors that fetch their shard and count its tokens (no model): what is timed
  is the driver's side. Reported: the driver's CPU time (``time.process_time``: every
  thread of this process, Ray's core worker included) per trajectory, the peak resident
  memory added while sending (``VmHWM`` after resetting it, minus the resident memory
  before), and the bytes of the call arguments.
- ``inflight``: the real control plane (scheduler, LLMProxy, buffer, pipeline) with the
  ``sim`` engine, trainer and envs (examples/paper-128gpu.yaml), ``rollout.max_envs`` =
  N and ``batch_size`` = N / 2 (async, alpha 2: N trajectories in flight), each run in a
  fresh process: its CPU time per launched trajectory, per generation call (turn; the
  number of turns a launched trajectory gets through in 3 steps is not fixed, so this is
  the per-work figure) and its peak resident memory. The run is in process on the
  simulator's virtual clock, so the CPU time is that of the driver plus the sim workers
  (which only sleep); on the real clock the same work is spread over the run's wall
  time. The sim trainer is in process: the ``send`` part is where the batch path shows.
  Of that CPU time, what Python's garbage collector took (``gc.callbacks``, per
  generation) is reported apart (docs/benchmarks.md).
- ``floor``: no control plane. N coroutines on the same virtual-time loop, each a
  trajectory of 6 turns with the control plane's await depth (episode -> rollout ->
  timed span -> :func:`rollart_sdk.control.aio.wait_for` -> a future) and a small
  state per turn (a context list copied into each request, a span appended); two stand-in
  "workers" answer the pending engine and env calls in batches, the oldest quarter every
  10 virtual ms (each call touched once); a new trajectory starts when one ends, until 2.5 N have run. Its CPU per
  turn is what any asyncio driver pays to resume N coroutines' worth of cold state: the
  part of the ``inflight`` rows' growth that is the interpreter's and the cache's, not
  the control plane's.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import statistics
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

from rollart_benchmark_suite import EXAMPLES
from rollart_sdk.types import TrainSample

RANKS = 2
SIM_CONFIG = EXAMPLES / "paper-128gpu.yaml"


def _status_kib(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def reset_peak() -> bool:
    """Reset this process's peak resident memory (Linux ``clear_refs`` 5)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def samples(n: int, tokens: int, seed: int = 0) -> list[TrainSample]:
    rng = random.Random(seed)
    prompt = tokens // 4
    out = []
    for i in range(n):
        ids = [rng.randrange(150_000) for _ in range(tokens)]
        lps = [0.0] * prompt + [-rng.random() for _ in range(tokens - prompt)]
        out.append(TrainSample(ids, [0] * prompt + [1] * (tokens - prompt), lps,
                               [-1] * prompt + [3] * (tokens - prompt), reward=float(i % 2),
                               group_id=f"g{i // 8}"))
    return out


class Rank:
    """A data-parallel rank that fetches its shard and counts its tokens."""

    def train_step(self, shard: Any) -> int:
        from rollart_sdk.cluster.shards import fetch_shard

        return sum(len(s.input_ids) for s in fetch_shard(shard))


def _arg_bytes(args: list[Any]) -> int:
    import ray

    ctx = ray._private.worker.global_worker.get_serialization_context()
    return max(ctx.serialize(a).total_bytes for a in args)


def send_once(handles: list[Any], batch: list[TrainSample], mode: str) -> dict[str, Any]:
    """Send ``batch`` to the ranks as ``Pipeline._train`` does (``mode`` refs) or did
    (``args``); the driver's CPU seconds, peak added MiB and argument bytes."""
    from rollart_sdk.cluster.shards import shard_batch
    from rollart_sdk.resources.decorators import dp_shards

    async def go() -> list[Any]:
        shards = (shard_batch(batch, handles) if mode == "refs"
                  else dp_shards(batch, len(handles)))
        got = await asyncio.gather(*(h.call("train_step", s)
                                     for h, s in zip(handles, shards, strict=True)))
        assert sum(got) == sum(len(s.input_ids) for s in batch)
        return shards

    gc.collect()
    peak_ok = reset_peak()
    rss0 = _status_kib("VmRSS") or 0
    c0 = time.process_time()
    shards = asyncio.run(go())
    cpu = time.process_time() - c0
    hwm = _status_kib("VmHWM")
    return {"cpu_s": cpu, "peak_mib": (hwm - rss0) / 1024 if peak_ok and hwm else None,
            "arg_bytes": _arg_bytes(shards)}


def run_send(sizes: list[int], tokens: int, repeats: int) -> list[dict[str, Any]]:
    import ray

    from rollart_sdk.cluster.handles import WorkerHandle
    from rollart_sdk.ray_utils import init_ray

    init_ray(num_cpus=1)
    try:
        cls = ray.remote(Rank)
        handles = [WorkerHandle(f"rank-{r}", cls.options(num_cpus=0).remote())
                   for r in range(RANKS)]
        send_once(handles, samples(8, tokens), "refs")  # warm-up
        rows = []
        for n in sizes:
            batch = samples(n, tokens)
            runs: dict[str, list[dict[str, Any]]] = {"args": [], "refs": []}
            for _ in range(repeats):  # the modes interleaved: the same load on both
                for mode in runs:
                    runs[mode].append(send_once(handles, batch, mode))
            rows += [_send_row(n, tokens, mode, r) for mode, r in runs.items()]
            del batch
        return rows
    finally:
        ray.shutdown()


def _median(xs: list[Any]) -> Any:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _send_row(n: int, tokens: int, mode: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    cpu = _median([r["cpu_s"] for r in runs])
    return {"part": "send", "trajectories": n, "tokens": tokens, "mode": mode,
            "repeats": len(runs), "cpu_s": round(cpu, 4),
            "cpu_us_per_traj": round(cpu / n * 1e6, 1),
            "peak_mib": _round(_median([r["peak_mib"] for r in runs]), 1),
            "arg_bytes": _median([r["arg_bytes"] for r in runs])}


def _round(x: float | None, nd: int) -> float | None:
    return None if x is None else round(x, nd)


class GcTimer:
    """CPU seconds and count of the garbage collector's passes, per generation, while on."""

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self.passes = [0, 0, 0]
        self.on = False
        self._t0 = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if not self.on:
            return
        if phase == "start":
            self._t0 = time.process_time()
        else:
            self.seconds[info["generation"]] += time.process_time() - self._t0
            self.passes[info["generation"]] += 1


def sim_once(n: int, steps: int) -> dict[str, Any]:
    """One simulated run with ``n`` trajectories in flight (this process: run it fresh)."""
    import tempfile

    from rollart_sdk.config import load_config
    from rollart_sdk.sim.job import build_sim_job, run_sim

    out = tempfile.mkdtemp(prefix="rollart-bench-driver-")
    # alpha 2: admission allows (version + 3) half-batches, so max_envs (n) binds and n
    # trajectories stay in flight (at alpha 1 the admission rule, AReaL's, keeps n / 2)
    cfg, lines = load_config(str(SIM_CONFIG), [
        f"output_dir={out}", f"rollout.max_envs={n}", f"rollout.batch_size={n // 2}",
        "rollout.alpha=2",
        f"train.steps={steps}", "sim.progress_every=0"])
    job = build_sim_job(cfg, lines)
    gct = GcTimer()
    gct.on = True
    c0 = time.process_time()
    records = run_sim(job, steps)
    cpu = time.process_time() - c0
    gct.on = False
    p = job.pipeline
    return {"cpu_s": cpu, "gc_s": gct.seconds, "gc_passes": gct.passes,
            "launched": p.scheduler.launched, "trained": p.buffer.trained,
            "turns": sum(p.proxy.served.values()),
            "in_flight_max": max(r.in_flight for r in records),
            "peak_rss_mib": (_status_kib("VmHWM") or 0) / 1024, "wall_s": job.wall_s}


class _Floor:
    """The ``floor`` part's program (see the module docstring)."""

    def __init__(self, n: int, turns: int) -> None:
        self.n, self.turns = n, turns
        self.pending: list[deque[tuple[asyncio.Future[list[int]], int]]] = [deque(), deque()]
        self.total, self.launched, self.live, self.done_turns = int(n * 2.5), 0, 0, 0
        self.finished: asyncio.Future[None] | None = None

    async def call(self, worker: int, size: int) -> list[int]:  # 0: engine, 1: env
        fut: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
        self.pending[worker].append((fut, size))
        return await fut

    async def answer(self) -> None:  # the stand-in workers: the oldest quarter every 10 ms
        while True:
            await asyncio.sleep(0.01)
            for queue in self.pending:
                for _ in range(-(-len(queue) // 4)):
                    fut, size = queue.popleft()
                    fut.set_result([1] * size)

    async def timed(self, spans: list[tuple[str, float, float]], span: str, coro: Any) -> Any:
        from rollart_sdk.control.aio import wait_for

        t0 = time.time()
        try:
            return await wait_for(coro, 100.0)
        finally:
            spans.append((span, t0, time.time()))

    async def rollout(self, spans: list[tuple[str, float, float]], out: list[Any]) -> None:
        context = [2] * 50
        for t in range(self.turns):
            request = {"request_id": t, "prompt_ids": list(context)}
            ids = await self.timed(spans, "generate", self.call(0, 8))
            out.append((request["request_id"], list(ids)))
            context += ids
            context += await self.timed(spans, "env_step", self.call(1, 10))

    async def episode(self) -> int:
        spans: list[tuple[str, float, float]] = []
        out: list[Any] = []
        await self.rollout(spans, out)
        return len(out)

    def launch(self) -> None:
        self.launched += 1
        self.live += 1
        asyncio.get_running_loop().create_task(self.episode()).add_done_callback(self.end)

    def end(self, task: asyncio.Task[int]) -> None:
        self.live -= 1
        self.done_turns += task.result()
        if self.launched < self.total:
            self.launch()
        elif self.live == 0 and self.finished is not None:
            self.finished.set_result(None)

    async def main(self) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        self.finished = loop.create_future()
        workers = loop.create_task(self.answer())
        c0 = time.process_time()
        for _ in range(self.n):
            self.launch()
        await self.finished
        cpu = time.process_time() - c0
        workers.cancel()
        return {"cpu_s": cpu, "launched": self.launched, "turns": self.done_turns}


def floor_once(n: int, turns: int = 6) -> dict[str, Any]:
    """The ``floor`` part, ``n`` in flight (this process: run it fresh)."""
    from rollart_sdk.sim.clock import VirtualTimeLoop

    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(_Floor(n, turns).main())
    finally:
        loop.close()


def _fresh(flag: str, n: int, steps: int) -> dict[str, Any]:
    res = subprocess.run([sys.executable, "-m", "rollart_benchmark_suite.driver",
                          flag, str(n), "--steps", str(steps)],
                         capture_output=True, text=True, timeout=1800, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"{flag[2:]} run with {n} in flight failed: {res.stderr[-2000:]}")
    out: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    return out


def run_inflight(sizes: list[int], steps: int, repeats: int, floor: bool = False
                 ) -> list[dict[str, Any]]:
    """The ``inflight`` rows (and the ``floor`` rows with ``floor``), a fresh process per
    run. The sizes take turns (every size once per round, ``repeats`` rounds), so a drift
    of the machine's speed during the bench lands on every size alike; with both parts,
    each sim run is followed by its floor run."""
    runs: dict[int, list[dict[str, Any]]] = {n: [] for n in sizes}
    floors: dict[int, list[dict[str, Any]]] = {n: [] for n in sizes}
    for _ in range(repeats):
        for n in sizes:
            runs[n].append(_fresh("--sim-once", n, steps))
            if floor:
                floors[n].append(_fresh("--floor-once", n, steps))
    rows = []
    for n in sizes:
        rows.append(_inflight_row(n, runs[n]))
        if floor:
            rows.append(_floor_row(n, floors[n]))
    return rows


def _floor_row(n: int, runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"part": "floor", "max_envs": n, "repeats": len(runs),
            "launched": _median([r["launched"] for r in runs]),
            "turns": _median([r["turns"] for r in runs]),
            "cpu_s": round(_median([r["cpu_s"] for r in runs]), 3),
            "cpu_us_per_turn": round(_median([r["cpu_s"] / r["turns"] * 1e6 for r in runs]), 1),
            "cpu_us_per_turn_runs": [round(r["cpu_s"] / r["turns"] * 1e6, 1) for r in runs]}


def _inflight_row(n: int, runs: list[dict[str, Any]]) -> dict[str, Any]:
    per = [r["cpu_s"] / r["launched"] * 1e6 for r in runs]
    gc_per = [sum(r["gc_s"]) / r["launched"] * 1e6 for r in runs]
    return {"part": "inflight", "max_envs": n, "repeats": len(runs),
            "in_flight_max": _median([r["in_flight_max"] for r in runs]),
            "launched": _median([r["launched"] for r in runs]),
            "cpu_s": round(_median([r["cpu_s"] for r in runs]), 2),
            "cpu_us_per_traj": round(_median(per), 1),
            "turns": _median([r["turns"] for r in runs]),
            "cpu_us_per_turn": round(_median([r["cpu_s"] / r["turns"] * 1e6 for r in runs]), 1),
            "cpu_us_per_turn_runs": [round(r["cpu_s"] / r["turns"] * 1e6, 1) for r in runs],
            "gc_us_per_traj": round(_median(gc_per), 1),
            "other_us_per_traj": round(_median([a - b for a, b in zip(per, gc_per, strict=True)]), 1),
            "peak_rss_mib": round(_median([r["peak_rss_mib"] for r in runs]), 1)}


def _print(rows: list[dict[str, Any]]) -> None:
    for r in rows:
        if r["part"] == "floor":
            print(f"floor    max_envs {r['max_envs']:>5}  {r['turns']} turns  cpu {r['cpu_s']} s "
                  f"= {r['cpu_us_per_turn']:.1f} us per turn")
        elif r["part"] == "send":
            print(f"send     {r['trajectories']:>5} traj x {r['tokens']} tok  {r['mode']:<4}  "
                  f"cpu {r['cpu_s']:.3f} s = {r['cpu_us_per_traj']:>7.1f} us/traj  "
                  f"peak +{r['peak_mib']} MiB  arg {r['arg_bytes']} B")
        else:
            print(f"inflight max_envs {r['max_envs']:>5} (in flight {r['in_flight_max']})  "
                  f"launched {r['launched']}  cpu {r['cpu_s']} s = "
                  f"{r['cpu_us_per_traj']:>7.1f} us/traj (gc {r['gc_us_per_traj']:.1f}, the rest "
                  f"{r['other_us_per_traj']:.1f}); {r['turns']} turns, {r['cpu_us_per_turn']:.1f} us "
                  f"per turn  peak RSS {r['peak_rss_mib']} MiB")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rollart bench driver", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 1024, 2048],
                        help="trajectories per batch (send) and in flight (inflight)")
    parser.add_argument("--tokens", type=int, default=1024, help="tokens per trajectory (send)")
    parser.add_argument("--steps", type=int, default=3, help="training steps per sim run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--parts", nargs="+", choices=["send", "inflight", "floor"],
                        default=["send", "inflight"],
                        help="floor: also the bare-asyncio floor beside each inflight run")
    parser.add_argument("--json", metavar="PATH", default=None, help="also write the rows here")
    parser.add_argument("--sim-once", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--floor-once", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.sim_once is not None:
        print(json.dumps(sim_once(args.sim_once, args.steps)))
        return 0
    if args.floor_once is not None:
        print(json.dumps(floor_once(args.floor_once)))
        return 0
    rows: list[dict[str, Any]] = []
    if "send" in args.parts:
        rows += run_send(args.sizes, args.tokens, args.repeats)
    if "inflight" in args.parts or "floor" in args.parts:
        rows += run_inflight(args.sizes, args.steps, args.repeats, "floor" in args.parts)
    _print(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
