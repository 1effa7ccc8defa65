"""The worker bindings of a running job, read from Ray's GCS (``rollart status``).

``collect_status`` runs in a driver connected to the running Ray cluster and returns every
binding record (worker, role, pool, hardware, node, preferred vs actual pool, reason) - the
same records dispatch and failover use.
"""

from __future__ import annotations

import glob
import logging
import os
import socket
import sys
import tempfile
from typing import Any


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


def local_cluster_addresses() -> list[str]:
    """GCS addresses (``127.0.0.1:PORT``) of the Ray clusters running on this machine,
    newest first: every session under Ray's temp folder whose GCS port answers."""
    root = os.path.join(os.environ.get("RAY_TMPDIR", tempfile.gettempdir()), "ray")
    found: list[str] = []
    for session in sorted(glob.glob(os.path.join(root, "session_2*")), reverse=True):
        for port_file in glob.glob(os.path.join(session, "gcs_server_port_*")):
            try:
                with open(port_file) as f:
                    port = int(f.read().strip())
            except (OSError, ValueError):
                continue
            address = f"127.0.0.1:{port}"
            if address not in found and _answers("127.0.0.1", port):
                found.append(address)
    return found


def _answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def connect(address: str) -> None:
    """Join the cluster at ``address`` as a passive driver. A cluster on 127.0.0.1 is
    reached from 127.0.0.1 (Ray would otherwise use the machine's routed address and hang)."""
    import ray

    from rollart_sdk.ray_utils import local_ray_env

    local_ray_env()
    host = address.rsplit(":", 1)[0]
    local = host in ("127.0.0.1", "localhost")
    ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR,
             _node_ip_address="127.0.0.1" if local else None)


def main(argv: list[str]) -> int:
    """``python -m rollart_sdk.resources.status ADDRESS [NAMESPACE]``: print the status of
    the cluster at ADDRESS as JSON (``rollart status`` runs this under a timeout)."""
    import json

    import ray

    address, namespace = argv[0], (argv[1] if len(argv) > 1 and argv[1] else None)
    connect(address)
    try:
        print(json.dumps({"address": address, **collect_status(namespace)}))
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
