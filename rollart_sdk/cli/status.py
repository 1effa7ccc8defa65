"""``rollart status``: the worker-to-pool bindings of a running job.

Finds the job's Ray cluster (``--address``, RAY_ADDRESS, or every Ray cluster running on
this machine, reached on 127.0.0.1) and prints every binding record (worker, role, pool,
hardware, node, preferred vs actual pool, reason) - the same records dispatch and
failover use. Each cluster is queried by a child process under ``--timeout``, so the
command never hangs on a cluster that does not answer.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any

from rich.table import Table

from rollart_sdk.cli.output import console
from rollart_sdk.errors import RollartError
from rollart_sdk.resources.status import local_cluster_addresses


def add_parser(sub: Any) -> None:
    p = sub.add_parser("status", help="show the worker-to-pool bindings of a running job")
    p.add_argument("--address", default=None,
                   help="Ray GCS address HOST:PORT (default: RAY_ADDRESS, else every Ray "
                        "cluster running on this machine)")
    p.add_argument("--namespace", default=None, help="only this job namespace (default: all)")
    p.add_argument("--timeout", type=float, default=60.0,
                   help="seconds to wait for each cluster's answer (default 60)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_status)


def query(address: str, namespace: str | None, timeout: float) -> dict[str, Any]:
    """One cluster's bindings and pools, from a child process (killed after ``timeout``)."""
    cmd = [sys.executable, "-m", "rollart_sdk.resources.status", address, namespace or ""]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RollartError(f"the Ray cluster at {address} did not answer within {timeout:g}s "
                           "(raise --timeout, or check the address)") from None
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["no output"])[-1]
        raise RollartError(f"could not read the Ray cluster at {address}: {last}")
    result: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    return result


def cmd_status(args: argparse.Namespace) -> int:
    address = args.address or os.environ.get("RAY_ADDRESS")
    if address and address != "auto":
        found = [query(address, args.namespace, args.timeout)]
    else:
        addresses = local_cluster_addresses()
        if not addresses:
            raise RollartError("no Ray cluster is running on this machine; start a run "
                               "first, or pass --address HOST:PORT of the cluster's GCS")
        # All at once: a stale session's port may now belong to a process that is no
        # GCS and never answers, and one such port per --timeout added up (a machine
        # with hundreds of old sessions under /tmp/ray waited minutes).
        from concurrent.futures import ThreadPoolExecutor

        def ask(a: str) -> dict[str, Any] | None:
            try:
                return query(a, args.namespace, args.timeout)
            except RollartError as exc:  # another user's cluster may be shutting down
                print(f"warning: {exc}", file=sys.stderr)
                return None

        with ThreadPoolExecutor(max_workers=min(16, len(addresses))) as pool:
            answers = [s for s in pool.map(ask, addresses) if s is not None]
        # The clusters running a rollart job (bindings recorded); all of them if none is.
        found = [s for s in answers if s["bindings"]] or answers
    if args.json:
        print(json.dumps(found[0] if len(found) == 1 else found, indent=2))
        return 0
    for status in found:
        _print(status)
    return 0


def _print(status: dict[str, Any]) -> None:
    table = Table(title=f"rollart bindings ({status['address']})")
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
