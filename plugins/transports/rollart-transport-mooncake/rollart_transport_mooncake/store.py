"""The Mooncake side of the transport: the master process and one store client per worker.

``mooncake_master`` ships in the ``mooncake-transfer-engine-non-cuda`` wheel. Started by
the sender when no master is given, it listens on ``host`` (127.0.0.1 by default) with its
HTTP metadata server beside it; each worker's client mounts a segment of its own (a unique
``host:port`` name) and moves bytes over TCP bound to ``MC_TCP_BIND_ADDRESS``.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
MIN_SEGMENT = 16 << 20  # Mooncake refuses smaller segments


class MooncakeUnavailable(RuntimeError):
    """The mooncake package or its system libraries are missing."""


def mooncake() -> Any:
    try:
        import mooncake as mc
        from mooncake import store  # noqa: F401 - loads libibverbs & co.
    except ImportError as exc:
        raise MooncakeUnavailable(
            f"transport mooncake: cannot import Mooncake ({exc}). Install it with "
            "`pip install mooncake-transfer-engine-non-cuda` and, on Debian/Ubuntu, "
            "`apt-get install libibverbs1 ibverbs-providers libnl-3-200 libnl-route-3-200`"
        ) from exc
    return mc


def free_port(host: str) -> int:
    return free_ports(host, 1)[0]


def free_ports(host: str, n: int) -> list[int]:
    """``n`` distinct free ports: each socket stays bound until all are chosen (one after
    another, the kernel may hand the same port out twice: a master once got its metrics
    port equal to its metadata port and died with "Address already in use")."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket()
            socks.append(s)
            s.bind((host, 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def _reachable(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), 0.2).close()
        return True
    except OSError:
        return False


def _die_with_parent() -> None:
    """Child side of Popen: the master goes when the process that started it goes."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class PortTaken(RuntimeError):
    """mooncake_master could not bind a port chosen for it (taken meanwhile)."""


@dataclass
class Master:
    """A running ``mooncake_master`` (started here, or attached to)."""

    address: str  # host:port of its RPC service
    metadata: str  # URL of its HTTP metadata server
    process: subprocess.Popen | None = None
    log_path: str | None = None

    @classmethod
    def start(cls, host: str, timeout_s: float = 60.0, attempts: int = 3) -> Master:
        """Start one on free ports; a start that lost a port to another process between
        choosing and binding it ("Address already in use") is tried again on new ones."""
        for attempt in range(attempts):
            try:
                return cls._start(host, timeout_s)
            except PortTaken:
                if attempt == attempts - 1:
                    raise
        raise AssertionError("unreachable")

    @classmethod
    def _start(cls, host: str, timeout_s: float) -> Master:
        binary = Path(mooncake().__file__).parent / "mooncake_master"
        if not binary.is_file():
            raise MooncakeUnavailable(f"transport mooncake: no mooncake_master at {binary}")
        rpc, http, metrics = free_ports(host, 3)
        fd, log_path = tempfile.mkstemp(prefix="rollart-mooncake-master-", suffix=".log")
        cmd = [
            str(binary), f"-rpc_port={rpc}", f"-rpc_address={host}",
            "-enable_http_metadata_server=true", f"-http_metadata_server_host={host}",
            f"-http_metadata_server_port={http}", f"-metrics_port={metrics}",
            f"-metrics_host={host}",
            # A reader's lease must outlast its transfer: with the default 10 s, a pull of
            # a large version that takes longer (two engines pulling 640 MB at once on a
            # loaded CPU) fails with -707. Removal is the trainer's call (force=True).
            "-default_kv_lease_ttl=600000",
        ]
        proc = subprocess.Popen(cmd, stdout=fd, stderr=subprocess.STDOUT,
                                preexec_fn=_die_with_parent)
        os.close(fd)
        master = cls(f"{host}:{rpc}", f"http://{host}:{http}/metadata", proc, log_path)
        deadline = time.monotonic() + timeout_s
        while not (_reachable(host, rpc) and _reachable(host, http)):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = Path(log_path).read_text(errors="replace")[-2000:]
                master.stop()
                raise (PortTaken if "Address already in use" in tail else RuntimeError)(
                    f"transport mooncake: mooncake_master did not come up on {host} "
                    f"(exit {proc.poll()}); its log {log_path} ends with:\n{tail}"
                )
            time.sleep(0.05)
        log.info("mooncake_master on %s (metadata %s, log %s)", master.address,
                 master.metadata, log_path)
        return master

    def check(self) -> None:
        """Raise when the master cannot be reached (before a client tries for minutes)."""
        host, _, port = self.address.rpartition(":")
        if not _reachable(host, int(port)):
            raise ConnectionError(f"no mooncake_master answers at {self.address}")
        try:
            urllib.request.urlopen(f"{self.metadata}?key=rollart-probe", timeout=5)
        except urllib.error.HTTPError:
            pass  # 404: the server answered
        except OSError as exc:
            raise ConnectionError(
                f"no Mooncake metadata server answers at {self.metadata}: {exc}"
            ) from exc

    def reachable(self) -> bool:
        host, _, port = self.address.rpartition(":")
        return _reachable(host, int(port))

    def stop(self) -> None:
        """Stop a master this process started, once no client of this process uses it."""
        if _CLIENTS.get(self.address):
            _DEFERRED[self.address] = self
            return
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.process = None


# Clients of this process per master address, and masters whose stop waits for them: a
# client whose master is gone spends ~20 s in RPC retries when it closes.
_CLIENTS: dict[str, int] = {}
_DEFERRED: dict[str, Master] = {}
_ORPHANS: list[Any] = []


def disconnect(master: Master, client: Any) -> None:
    """Close ``client`` (unmounting its segment); stop a master whose stop waited for it."""
    _CLIENTS[master.address] = max(_CLIENTS.get(master.address, 1) - 1, 0)
    if master.reachable():
        try:
            client.close()
        except Exception as exc:  # noqa: BLE001 - closing must not mask the run's outcome
            log.warning("transport mooncake: closing the store client failed: %s", exc)
    else:  # nothing to unmount from; keep it referenced so no destructor retries either
        _ORPHANS.append(client)
    deferred = _DEFERRED.pop(master.address, None)
    if deferred is not None:
        deferred.stop()


def connect(master: Master, host: str, segment_bytes: int, buffer_bytes: int) -> tuple[Any, str]:
    """A store client with a segment of its own; returns (client, segment name)."""
    os.environ.setdefault("MC_TCP_BIND_ADDRESS", host)
    from mooncake.store import MooncakeDistributedStore

    master.check()
    client = MooncakeDistributedStore()
    name = f"{host}:{free_port(host)}"
    rc = client.setup(name, master.metadata, max(segment_bytes, MIN_SEGMENT),
                      max(buffer_bytes, MIN_SEGMENT), "tcp", "", master.address)
    if rc != 0:
        raise ConnectionError(
            f"transport mooncake: store setup failed (code {rc}) for segment {name} with "
            f"master {master.address}, metadata {master.metadata}"
        )
    _CLIENTS[master.address] = _CLIENTS.get(master.address, 0) + 1
    return client, name


def register(client: Any, tensor: Any) -> None:
    rc = client.register_buffer(tensor.data_ptr(), tensor.numel() * tensor.element_size())
    if rc != 0:
        raise RuntimeError(f"transport mooncake: register_buffer failed (code {rc})")


def unregister(client: Any, tensor: Any) -> None:
    rc = client.unregister_buffer(tensor.data_ptr())
    if rc != 0:
        log.debug("transport mooncake: unregister_buffer returned %s", rc)
