"""``rollart status``: the worker bindings of a running job, read from Ray's GCS.

Connects to the running Ray cluster (``--address``, RAY_ADDRESS, or the local one) as a
passive driver and prints every binding record (worker, role, pool, hardware, node,
preferred vs actual pool, reason) - the same records dispatch and failover use.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("status", help="show the worker-to-pool bindings of a running job")
    p.add_argument("--address", default=None,
                   help="Ray address (default: RAY_ADDRESS, else the local running cluster)")
    p.add_argument("--namespace", default=None, help="only this job namespace (default: all)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_status)


def collect_status(namespace: str | None = None) -> dict[str, Any]:
    """Bindings (and per-pool reservation totals) from the connected Ray cluster."""
    import ray

    from rollart_sdk.resources.manager import read_bindings
    from rollart_sdk.resources.plan import POOL_RESOURCE_PREFIX

    bindings = [b.to_json() for b in read_bindings(namespace)]
    total = ray.cluster_resources()
    free = ray.available_resources()
    pools = {
        k[len(POOL_RESOURCE_PREFIX):]: {"total": v, "free": free.get(k, 0.0)}
        for k, v in total.items()
        if k.startswith(POOL_RESOURCE_PREFIX)
    }
    return {"bindings": bindings, "pools": pools}


def cmd_status(args: argparse.Namespace) -> int:
    import ray

    from rollart_sdk.errors import RollartError
    from rollart_sdk.ray_utils import local_ray_env

    local_ray_env()
    address = args.address or os.environ.get("RAY_ADDRESS") or "auto"
    try:
        ray.init(address=address, log_to_driver=False, logging_level="ERROR",
                 include_dashboard=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise RollartError(
            f"no running Ray cluster at {address!r} ({exc}); start a run first, or pass "
            "--address HOST:PORT of the cluster's GCS"
        ) from None
    try:
        status = collect_status(args.namespace)
    finally:
        ray.shutdown()
    if args.json:
        print(json.dumps(status, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title="rollart bindings")
    for col in ("namespace", "worker", "role", "pool", "hardware", "node", "preferred", "reason"):
        table.add_column(col)
    for b in status["bindings"]:
        pref = b["preferred"] + (" [yellow](fallback)[/yellow]" if b["fallback"] else "")
        table.add_row(b["namespace"], b["worker"], b["role"], b["pool"], b["hardware"],
                      (b["node_id"] or "-")[:12], pref, b["reason"])
    console.print(table)
    if not status["bindings"]:
        console.print("no bindings recorded (no job running in this cluster/namespace)")
    pools = Table(title="pools")
    for col in ("pool", "total", "free"):
        pools.add_column(col)
    for name, v in sorted(status["pools"].items()):
        pools.add_row(name, f"{v['total']:g}", f"{v['free']:g}")
    console.print(pools)
    return 0
