"""``rollart bench dispatch``: what a Cluster call adds on top of a raw Ray actor call.

The same actor is called both ways, alternately (so drift in machine load hits both
equally): ``ray.get(actor.echo.remote(i))`` against ``cluster.echo(i)`` for each dispatch
mode. ``extra_ms_median`` is the median of the per-pair differences for mode ``one``;
``submit_extra_us_median`` isolates the Cluster's own Python work (submission only).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from rollart_sdk.cluster import Worker, hw_mapping, register


class EchoWorker(Worker):
    """A worker whose methods do nothing, so only dispatch is measured."""

    role = "environment"

    @register(mode="one")
    def echo(self, x: int) -> int:
        return x

    @hw_mapping(hw_affinity={"FrozenLake": "local", "default": "local"})
    def routed(self, x: int, tag_name: str = "default") -> int:
        return x

    @register(mode="execute_all")
    def broadcast(self, x: int) -> int:
        return x


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def run(calls: int = 2000, warmup: int = 200, address: str | None = None) -> dict[str, Any]:
    import ray

    from rollart_sdk.cluster import Cluster
    from rollart_sdk.config import PoolConfig
    from rollart_sdk.ray_utils import init_ray
    from rollart_sdk.resources import ResourceManager

    started = not ray.is_initialized()
    init_ray(address=address, num_cpus=1, resources={"pool:local": 2})
    rm = ResourceManager([PoolConfig(name="local", hardware="cpu", kind="cpu", count=2)],
                         namespace="bench-dispatch")
    cluster = Cluster(EchoWorker, resource_manager=rm, num_workers=1, name="bench")
    actor = cluster.workers[0].actor
    try:
        pairs = {
            "one": (lambda i: ray.get(actor.echo.remote(i)), lambda i: cluster.echo(i)),
            "hw_mapping": (
                lambda i: ray.get(actor.routed.remote(i, tag_name="FrozenLake")),
                lambda i: cluster.routed(i, tag_name="FrozenLake"),
            ),
            "execute_all": (
                lambda i: ray.get([actor.broadcast.remote(i)]),
                lambda i: cluster.broadcast(i),
            ),
        }
        modes: dict[str, Any] = {}
        for mode, (raw, clu) in pairs.items():
            for i in range(warmup):
                raw(i)
                clu(i)
            raw_t, clu_t, diff = [], [], []
            for i in range(calls):
                t0 = time.perf_counter()
                raw(i)
                t1 = time.perf_counter()
                clu(i)
                t2 = time.perf_counter()
                raw_t.append((t1 - t0) * 1e3)
                clu_t.append((t2 - t1) * 1e3)
                diff.append(((t2 - t1) - (t1 - t0)) * 1e3)
            modes[mode] = {
                "raw_ms_median": statistics.median(raw_t),
                "cluster_ms_median": statistics.median(clu_t),
                "extra_ms_median": statistics.median(diff),
                "extra_ms_p90": _pct(diff, 0.9),
            }
        # Submission only: the Cluster's own Python work, without the round trip.
        sub_raw, sub_clu, refs = [], [], []
        for i in range(calls):
            t0 = time.perf_counter()
            refs.append(actor.echo.remote(i))
            t1 = time.perf_counter()
            refs.append(cluster.echo.refs(i))
            t2 = time.perf_counter()
            sub_raw.append(t1 - t0)
            sub_clu.append(t2 - t1)
            if len(refs) >= 200:
                ray.get(refs)
                refs.clear()
        ray.get(refs)
        submit_extra_us = (statistics.median(sub_clu) - statistics.median(sub_raw)) * 1e6
    finally:
        cluster.shutdown()
        if started:
            ray.shutdown()
    return {
        "benchmark": "dispatch",
        "calls": calls,
        "extra_ms_median": modes["one"]["extra_ms_median"],
        "submit_extra_us_median": submit_extra_us,
        "modes": modes,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rollart bench dispatch", description=__doc__)
    parser.add_argument("--calls", type=int, default=2000, help="timed calls per mode")
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--address", default=None, help="Ray address (default: start locally)")
    parser.add_argument("--json", metavar="PATH", default=None, help="also write results here")
    args = parser.parse_args(argv)
    res = run(args.calls, args.warmup, args.address)

    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Cluster dispatch vs raw Ray actor call ({args.calls} calls per mode)")
    for col in ("mode", "raw median ms", "cluster median ms", "extra median ms", "extra p90 ms"):
        table.add_column(col, justify="right" if col != "mode" else "left")
    for mode, m in res["modes"].items():
        table.add_row(mode, f"{m['raw_ms_median']:.3f}", f"{m['cluster_ms_median']:.3f}",
                      f"{m['extra_ms_median']:.3f}", f"{m['extra_ms_p90']:.3f}")
    console = Console()
    console.print(table)
    console.print(f"extra_ms_median (mode one): {res['extra_ms_median']:.4f} ms; "
                  f"Cluster submit work: {res['submit_extra_us_median']:.1f} us per call")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
        console.print(f"wrote {args.json}")
    return 0
