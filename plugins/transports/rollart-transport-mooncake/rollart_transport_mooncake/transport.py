"""Weight transport "mooncake": publish each version once into a Mooncake store; every
engine pulls it in the background, straight into registered buffers.

Sender (``role="sender"``, the trainer's rank 0): starts a ``mooncake_master`` (or attaches
to ``master``), mounts a segment sized for ``keep_versions + 1`` versions, and for each
version packs the buckets into store objects of up to ``object_mb`` (1 GB by default, the
paper's bucket size; each tensor 64-byte aligned), ``put_from``'s each object once under
``rollart/<sender id>/v<version>/o<i>`` and keeps it in its own segment (the objects live in
the trainer's memory until released). Versions older than the newest ``keep_versions`` are
removed (``force=True``); ``release(version)`` removes one at once (the control plane does
so once every engine committed a newer version).

Receivers (``role="receiver"``, one per engine worker): a client with a segment of its own
(16 MiB, Mooncake's minimum); ``fetch`` ``batch_get_into``'s every object of the version
into registered staging buffers (two sets, alternating by version parity, so a version's
tensors stay valid while the next one arrives), cuts them into named tensors (views, no
copy) and verifies every bucket's sha256 against the manifest before yielding it.

A get that does not return within ``fetch_timeout_s`` fails the fetch, but Mooncake may
still write into its buffers: that set is *abandoned* (``abandoned_transfers``), kept
registered and referenced until the call returns, then unregistered and dropped. The
receiver never holds more than two sets of staging buffers, abandoned ones included: a
fetch that needs a new set while that budget is spent waits (within its own timeout) for
the stuck call, then fails saying so; it never registers another model's worth of RAM.

One fetch at a time per buffer set: a fetch of a version whose set another fetch is still
using (the stager replaced a running fetch of version v by v + 2 while v's get was still in
flight) waits within its own timeout for that one to end, then fails naming it, instead of
both writing into the same buffers. ``close`` during a live get treats it as abandoned: its
buffers and client are released once it returns, never under it.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from rollart_sdk.types import WeightBucket, WeightManifest
from rollart_sdk.weights import WeightSyncError, bucket_ref, verify
from rollart_transport_mooncake import store as mc

TRANSPORT_NAME = "mooncake"
ALIGN = 64
OBJECT_NOT_FOUND = -704
STAGING_SETS = 2  # staging buffer sets a receiver may hold, abandoned ones included
log = logging.getLogger(__name__)


class MooncakeTransportOptions(BaseModel):
    """Options of ``transport: {name: mooncake, options: {...}}``."""

    model_config = ConfigDict(extra="forbid")

    master: str | None = Field(
        None, description="host:port of a running mooncake_master to attach to; by "
        "default the trainer starts one (from the wheel) on `host`",
    )
    metadata_server: str | None = Field(
        None, description="URL of the metadata server (http://host:port/metadata); "
        "default: the started master's own; required with `master`",
    )
    host: str = Field(
        "127.0.0.1", description="address the master, the metadata server and every "
        "client bind to (MC_TCP_BIND_ADDRESS); a routable one across machines",
    )
    object_mb: float = Field(
        1024.0, gt=0, description="store object size: buckets are packed into objects of "
        "up to this size (1 GB as in the paper)",
    )
    keep_versions: int = Field(
        3, ge=1, description="published versions kept; older ones are removed (3: the "
        "version the engines serve, the one they receive and the one just published, with "
        "deferred updates; an engine restarted after its process died reloads the served one)",
    )
    segment_mb: float | None = Field(
        None, gt=0, description="the trainer's segment; default: room for keep_versions+1 "
        "versions (sized at the first publish)",
    )
    fetch_timeout_s: float = Field(
        300.0, gt=0, description="seconds an engine waits for a version's objects",
    )


def _tensor_bytes(t: Any) -> Any:
    import torch

    return t.detach().contiguous().reshape(-1).view(torch.uint8)


@dataclass(eq=False)
class _Abandoned:
    """A ``batch_get_into`` that outlived ``fetch_timeout_s``: Mooncake may still write into
    ``buffers`` (registered with ``client``), so they are neither unregistered nor freed
    before ``future`` is done."""

    version: int
    future: concurrent.futures.Future
    buffers: list[Any]
    client: Any
    since: float  # time.monotonic() when it was abandoned

    @property
    def nbytes(self) -> int:
        return sum(b.numel() for b in self.buffers)


def _dtype(name: str) -> Any:
    import torch

    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r} in a manifest")
    return dtype


class MooncakeTransport:
    style: ClassVar[Literal["push", "pull"]] = "pull"

    def __init__(
        self,
        role: str = "sender",
        master: str | None = None,
        metadata_server: str | None = None,
        host: str = "127.0.0.1",
        object_mb: float = 1024.0,
        keep_versions: int = 3,
        segment_mb: float | None = None,
        fetch_timeout_s: float = 300.0,
    ) -> None:
        if role not in ("sender", "receiver"):
            raise ValueError(f"role must be 'sender' or 'receiver', got {role!r}")
        if master and not metadata_server:
            raise ValueError("transport mooncake: with `master` give `metadata_server` too "
                             "(http://host:port/metadata)")
        self.role = role
        self.host = host
        self.object_bytes = max(int(object_mb * 2**20), 1)
        self.keep_versions = keep_versions
        self.segment_bytes = int(segment_mb * 2**20) if segment_mb else None
        self.fetch_timeout_s = fetch_timeout_s
        self._master = mc.Master(master, metadata_server) if master and metadata_server else None
        self._client: Any = None
        self.segment: str | None = None
        self._id = uuid.uuid4().hex[:12]
        self._published: OrderedDict[int, list[str]] = OrderedDict()
        self._last_version: int | None = None
        self._buffer: Any = None  # sender: the registered publish buffer (reused)
        self._slots: dict[int, list[Any]] = {}  # receiver: staging buffers by version parity
        # Receiver: gets that timed out, with the buffers they may still write into; and
        # clients closed while one of them was in flight (disconnected once they returned).
        self._abandoned: list[_Abandoned] = []
        self._retired: list[tuple[Any, mc.Master]] = []
        self._lock = threading.RLock()  # the lists above, slots and client teardown
        self._freed = threading.Condition(self._lock)  # a fetch let go of its buffer set
        self._busy: dict[int, int] = {}  # receiver: parity -> version of the fetch using it
        # receiver: parity -> the get in flight (future, buffers, client, version)
        self._live: dict[int, tuple[concurrent.futures.Future, list[Any], Any, int]] = {}
        self.abandoned_released = 0  # abandoned sets unregistered once their get returned
        self.last_fetch: dict[str, float] = {}

    # ------------------------------------------------------------------ sender
    def publish(self, version: int, buckets: Iterable[WeightBucket]) -> WeightManifest:
        if self.role != "sender":
            raise RuntimeError("publish is the trainer's side; this transport has "
                               f"role={self.role!r}")
        buckets = list(buckets)
        if self._last_version is not None and version <= self._last_version:
            raise ValueError(f"versions must increase: {version} after {self._last_version}")
        objects, refs = self._layout(version, buckets)
        total = sum(size for size, _ in objects)
        self._ensure_sender(total)
        keys: list[str] = []
        self._published[version] = keys  # so that a failure mid-way still cleans up
        self._last_version = version
        try:
            for i, (size, members) in enumerate(objects):
                buffer = self._publish_buffer(size)
                for tensor, offset in members:
                    n = tensor.numel() * tensor.element_size()
                    if n:
                        buffer[offset : offset + n].copy_(_tensor_bytes(tensor))
                key = f"rollart/{self._id}/v{version}/o{i}"
                self._put(key, buffer, size, version)
                keys.append(key)
        except Exception:
            self.release(version)
            raise
        for old in list(self._published)[: -self.keep_versions]:
            self.release(old)
        assert self._master is not None, "_ensure_sender started or attached the master"
        return WeightManifest(version, TRANSPORT_NAME, refs, meta={
            "master": self._master.address, "metadata": self._master.metadata,
            "objects": [[k, size] for k, (size, _) in zip(keys, objects, strict=True)],
            "sender": self._id,
        })

    def _layout(self, version: int, buckets: list[WeightBucket]) -> tuple[list, list]:
        """Pack buckets into objects of up to ``object_bytes`` (a bigger bucket gets one of
        its own); every tensor starts 64-byte aligned. Returns the objects as
        ``(size, [(tensor, offset)])`` and the manifest entries."""
        objects: list[tuple[int, list[tuple[Any, int]]]] = []
        refs = []
        size, members = 0, list[tuple[Any, int]]()
        for b in buckets:
            if b.version != version:
                raise ValueError(f"bucket {b.index} of version {b.version} published as "
                                 f"version {version}")
            need = sum(math.ceil(t.numel() * t.element_size() / ALIGN) * ALIGN
                       for t in b.tensors.values())
            if members and size + need > self.object_bytes:
                objects.append((size, members))
                size, members = 0, []
            tensors = []
            for name, t in b.tensors.items():
                n = t.numel() * t.element_size()
                members.append((t, size))
                tensors.append([name, str(t.dtype), list(t.shape), size])
                size += math.ceil(n / ALIGN) * ALIGN
            refs.append(bucket_ref(b, handle={"object": len(objects), "tensors": tensors}))
        if members:
            objects.append((size, members))
        return objects, refs

    def _ensure_sender(self, version_bytes: int) -> None:
        if self._client is not None:
            return
        if self._master is None:
            self._master = mc.Master.start(self.host)
        segment = self.segment_bytes or int(
            (self.keep_versions + 1) * version_bytes * 1.25) + (16 << 20)
        self._client, self.segment = mc.connect(self._master, self.host, segment, 16 << 20)

    def _publish_buffer(self, size: int) -> Any:
        import torch

        if self._buffer is None or self._buffer.numel() < size:
            if self._buffer is not None:
                mc.unregister(self._client, self._buffer)
            self._buffer = torch.empty(max(size, 1), dtype=torch.uint8)
            mc.register(self._client, self._buffer)
        return self._buffer

    def _put(self, key: str, buffer: Any, size: int, version: int) -> None:
        from mooncake.store import ReplicateConfig

        cfg = ReplicateConfig()
        cfg.replica_num = 1
        cfg.preferred_segment = self.segment  # the trainer's memory, not an engine's
        cfg.with_hard_pin = True  # never evicted: removal is release()'s decision
        rc = self._client.put_from(key, buffer.data_ptr(), max(size, 1), cfg)
        if rc != 0:
            raise WeightSyncError(
                version, f"put of {key} ({size} bytes) into the Mooncake store failed with "
                f"code {rc}; if the segment is full raise transport.options.segment_mb "
                f"(now {self.segment_bytes or 'auto'}) or lower keep_versions",
            )

    def release(self, version: int) -> None:
        """Remove a published version's objects (force: readers' leases do not matter)."""
        keys = self._published.pop(version, [])
        for key in keys:
            rc = self._client.remove(key, True)
            if rc not in (0, OBJECT_NOT_FOUND):
                log.warning("transport mooncake: remove %s returned %s", key, rc)

    @property
    def published_versions(self) -> list[int]:
        return list(self._published)

    # ------------------------------------------------------------------ receiver
    def fetch(self, manifest: WeightManifest) -> Iterator[WeightBucket]:

        v = manifest.version
        if manifest.transport != TRANSPORT_NAME:
            raise WeightSyncError(v, f"manifest of transport {manifest.transport!r} given to "
                                     "transport 'mooncake'; sender and receivers must use "
                                     "the same transport")
        objects = manifest.meta.get("objects")
        if not objects:
            raise WeightSyncError(v, "the manifest lists no store objects (meta['objects'])")
        self._ensure_receiver(manifest)
        deadline = time.monotonic() + self.fetch_timeout_s  # waiting for buffers included
        self._claim(v, deadline)
        try:
            yield from self._fetch(manifest, objects, deadline)
        finally:  # exhausted, closed or collected: the set is free for the next fetch
            with self._freed:
                if self._busy.get(v % 2) == v:
                    del self._busy[v % 2]
                self._freed.notify_all()

    def _claim(self, version: int, deadline: float) -> None:
        """Take this version's buffer set (its parity) for this fetch; while another fetch
        uses it, wait for that one until ``deadline``, then raise."""
        parity = version % 2
        with self._freed:
            while parity in self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise WeightSyncError(
                        version, f"the staging buffers of version parity {parity} are "
                        f"still in use by the fetch of version {self._busy[parity]}, which "
                        f"did not end within fetch_timeout_s ({self.fetch_timeout_s}s); "
                        "two fetches never write into the same buffers")
                self._freed.wait(left)
            self._busy[parity] = version

    def _fetch(self, manifest: WeightManifest, objects: list[Any],
               deadline: float) -> Iterator[WeightBucket]:
        import torch

        v = manifest.version
        buffers = self._staging(v, [size for _, size in objects], deadline)
        keys = [key for key, _ in objects]
        sizes = [max(int(size), 1) for _, size in objects]
        t0 = time.perf_counter()
        codes = self._get(v, keys, buffers, sizes, deadline)
        self.last_fetch = {"seconds": time.perf_counter() - t0, "bytes": float(sum(sizes))}
        for key, code, size in zip(keys, codes, sizes, strict=True):
            if code == OBJECT_NOT_FOUND:
                raise WeightSyncError(
                    v, f"store object {key} is gone: the version was released (the trainer "
                    "keeps only its newest keep_versions) or the trainer's store went away",
                )
            if code != size:
                raise WeightSyncError(v, f"get of store object {key} returned {code}, "
                                         f"expected {size} bytes")
        for ref in manifest.buckets:
            buf = buffers[ref.handle["object"]]
            tensors: dict[str, Any] = {}
            for name, dtype_name, shape, offset in ref.handle["tensors"]:
                dtype = _dtype(dtype_name)
                numel = math.prod(shape)
                if numel == 0:
                    tensors[name] = torch.empty(shape, dtype=dtype)
                    continue
                n = numel * torch.empty(0, dtype=dtype).element_size()
                tensors[name] = buf[offset : offset + n].view(dtype).view(shape)
            bucket = WeightBucket(v, ref.index, tensors, ref.checksum)
            verify(bucket, ref, v)
            yield bucket

    def _ensure_receiver(self, manifest: WeightManifest) -> None:
        address = manifest.meta.get("master")
        if self._client is not None and self._master is not None and (
                self._master.address == address):
            return
        self._close_client()
        metadata = manifest.meta.get("metadata")
        if not address or not metadata:
            raise ValueError(f"transport mooncake: the manifest of version {manifest.version} "
                             "names no master or metadata server (meta: master, metadata)")
        self._master = mc.Master(address, metadata)
        try:
            self._client, self.segment = mc.connect(self._master, self.host, 0, 16 << 20)
        except Exception as exc:
            self._client = None
            raise WeightSyncError(manifest.version, f"cannot join the Mooncake store of "
                                                    f"master {address}: {exc}") from exc

    def _staging(self, version: int, sizes: list[int], deadline: float) -> list[Any]:
        """Registered buffers for this version's objects (reused every other version).

        A new set is registered only within the budget of ``STAGING_SETS`` sets, abandoned
        ones included; past it, wait until ``deadline`` for abandoned gets to return (their
        sets are then released), else raise."""
        import torch

        parity = version % 2

        def fits(slot: list[Any]) -> bool:
            return len(slot) == len(sizes) and all(
                b.numel() >= max(s, 1) for b, s in zip(slot, sizes, strict=True))

        def over_budget() -> list[_Abandoned]:
            others = sum(1 for p in self._slots if p != parity)
            return list(self._abandoned) if len(self._abandoned) + others >= STAGING_SETS else []

        with self._lock:
            self._reap()
            slot = self._slots.get(parity, [])
            if fits(slot):
                return slot
            stuck = over_budget()
        if stuck:
            concurrent.futures.wait([a.future for a in stuck],
                                    timeout=max(deadline - time.monotonic(), 0.0))
        with self._lock:
            self._reap()
            stuck = over_budget()
            if stuck:
                now = time.monotonic()
                held = ", ".join(f"version {a.version} ({a.nbytes / 2**20:.1f} MiB, stuck "
                                 f"{now - a.since:.0f}s)" for a in stuck)
                raise WeightSyncError(
                    version, f"a previous transfer is still stuck in the Mooncake store: "
                    f"the get of {held} outlived fetch_timeout_s ({self.fetch_timeout_s}s) "
                    "and has not returned, so its staging buffers stay registered (Mooncake "
                    "may still write into them); refusing to register another set for this "
                    f"version (the receiver holds at most {STAGING_SETS})",
                )
            slot = self._slots.pop(parity, [])
            for b in slot:
                mc.unregister(self._client, b)
            slot = [torch.empty(max(s, 1), dtype=torch.uint8) for s in sizes]
            for b in slot:
                mc.register(self._client, b)
            self._slots[parity] = slot
            return slot

    def _get(self, version: int, keys: list[str], buffers: list[Any],
             sizes: list[int], deadline: float) -> list[int]:
        """``batch_get_into`` bounded by ``deadline`` (``fetch_timeout_s`` after the fetch
        joined the store, any wait for buffers included). It runs in a daemon thread of its own: a call that never returns must not
        keep the process from exiting (a ThreadPoolExecutor's worker is joined at exit)."""
        client = self._client
        ptrs = [b.data_ptr() for b in buffers]
        future: concurrent.futures.Future = concurrent.futures.Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(list(client.batch_get_into(keys, ptrs, sizes)))
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting fetch
                future.set_exception(exc)

        with self._lock:
            self._live[version % 2] = (future, buffers, client, version)
        threading.Thread(target=run, name=f"mooncake-get-v{version}", daemon=True).start()
        try:
            return future.result(timeout=max(deadline - time.monotonic(), 0.0))
        except concurrent.futures.TimeoutError:
            self._abandon(version, future, buffers, client)
            raise WeightSyncError(
                version, f"the store did not deliver within {self.fetch_timeout_s}s "
                f"(fetch_timeout_s); its staging buffers stay registered until the get "
                f"returns ({self.abandoned_transfers} transfer(s) abandoned)",
            ) from None
        finally:
            with self._lock:
                if self._live.get(version % 2, (None,))[0] is future:
                    del self._live[version % 2]

    def _abandon(self, version: int, future: concurrent.futures.Future,
                 buffers: list[Any], client: Any) -> None:
        """The get may still write into ``buffers``: never hand them out again, and keep
        them registered and referenced until it returns (then ``_reap`` releases them)."""
        record = _Abandoned(version, future, buffers, client, time.monotonic())
        with self._lock:
            parity = version % 2
            if self._slots.get(parity) is buffers:
                del self._slots[parity]
            if any(a.future is future for a in self._abandoned):
                return  # close() abandoned it already (it closed under the live get)
            self._abandoned.append(record)
        log.warning("transport mooncake: the get of version %d did not return within %ss; "
                    "its %.1f MiB of staging buffers stay registered until it does "
                    "(%d abandoned)", version, self.fetch_timeout_s, record.nbytes / 2**20,
                    len(self._abandoned))
        # Runs in the get's thread once it returns (at once if it already did).
        future.add_done_callback(lambda _: self._release_abandoned())

    def _release_abandoned(self) -> None:
        with self._lock:
            self._reap()

    def _reap(self) -> None:
        """Release the sets of abandoned gets that have returned (under ``_lock``), and
        disconnect retired clients none of whose gets is still in flight. A get that never
        returns keeps its buffers (and its client) referenced for the process's lifetime:
        freeing memory Mooncake may still write into would corrupt the heap."""
        for record in [a for a in self._abandoned if a.future.done()]:
            for b in record.buffers:
                mc.unregister(record.client, b)
            self.abandoned_released += 1
            # Off the list last: a reader of abandoned_transfers (no lock) that sees it
            # gone sees its buffers released.
            self._abandoned.remove(record)
            exc = record.future.exception()
            log.info("transport mooncake: the abandoned get of version %d returned after "
                     "%.0fs (%s); its %.1f MiB of staging buffers are released",
                     record.version, time.monotonic() - record.since,
                     f"{type(exc).__name__}: {exc}" if exc else "completed",
                     record.nbytes / 2**20)
        for client, master in list(self._retired):
            if not any(a.client is client for a in self._abandoned):
                self._retired.remove((client, master))
                mc.disconnect(master, client)

    @property
    def abandoned_transfers(self) -> int:
        """Timed-out gets that have not returned yet (their buffers stay registered)."""
        return len(self._abandoned)

    @property
    def abandoned_bytes(self) -> int:
        """Staging bytes held by :attr:`abandoned_transfers`."""
        return sum(a.nbytes for a in list(self._abandoned))

    # ------------------------------------------------------------------ both
    def _close_client(self) -> None:
        with self._lock:
            self._reap()
            if self._client is None:
                return
            assert self._master is not None, "a client is connected to a master"
            if self._buffer is not None:
                mc.unregister(self._client, self._buffer)
                self._buffer = None
            # A get still in flight (not timed out yet) may still write into its buffers:
            # abandoned now, released (and its client closed) once it returns.
            for parity, (future, buffers, client, version) in list(self._live.items()):
                if future.done() or client is not self._client:
                    continue
                if self._slots.get(parity) is buffers:
                    del self._slots[parity]
                self._abandoned.append(_Abandoned(version, future, buffers, client,
                                                  time.monotonic()))
                future.add_done_callback(lambda _: self._release_abandoned())
            for slot in self._slots.values():
                for b in slot:
                    mc.unregister(self._client, b)
            self._slots.clear()
            stuck = [a for a in self._abandoned if a.client is self._client]
            if stuck:
                # Neither unregister nor close under a get still in flight: _reap does
                # both once the last of them returned (never, if it never returns).
                log.warning("transport mooncake: %d get(s) still stuck at close; the store "
                            "client and %.1f MiB of staging buffers are released once they "
                            "return", len(stuck), sum(a.nbytes for a in stuck) / 2**20)
                self._retired.append((self._client, self._master))
            else:
                mc.disconnect(self._master, self._client)
            self._client = None

    def close(self) -> None:
        if self.role == "sender" and self._client is not None:
            for version in list(self._published):
                self.release(version)
        self._close_client()
        if self.role == "sender" and self._master is not None:
            self._master.stop()
