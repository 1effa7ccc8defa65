"""Weight transport "nccl": broadcast each version from the trainer's rank 0 to every engine.

Style ``push``: ``publish`` and every engine's ``fetch`` of the same version meet in one
round of collectives. The sender (``role="sender"``, the trainer's rank 0) owns a
``TCPStore`` of its own (``host``, ``port``; port 0 picks a free one) and advertises it in
every manifest (``meta["store"]``). One round, for version ``v``:

1. ``publish`` flattens the buckets per dtype (a copy: training may go on), returns the
   manifest at once and runs the round in a background thread;
2. each engine's ``fetch`` (run by its :class:`~rollart_sdk.weights.WeightStager`)
   connects to the store, takes a slot and reports which group it holds;
3. once the ``meta["receivers"]`` engines of the manifest have joined, the sender keeps
   the current group when every engine already holds it, or else creates a new one (its
   own ``PrefixStore``) that every engine enters: an engine joining late, or restarted
   with nothing, makes the next round re-form the group with everyone;
4. the sender broadcasts a JSON header (bucket layout and checksums) and then each flat
   buffer; a final all-reduce tells everyone the round completed;
5. receivers cut the buffers back into named tensors and verify every bucket against the
   manifest's checksum before yielding it.

Reload (a restarted engine catching up, ``control/recovery.py``): a manifest with
``meta["reload"]`` is a version the other engines already received; the sender keeps the
newest ``KEEP_VERSIONS`` (3) it published (a CPU copy once broadcast; dropped at ``release``)
and its replay thread sends one of them to that one receiver in a group of two of its
own, beside any round in progress (which the receiver is not part of). The receiver asks
under ``replay/<id>`` (ids from the counter ``replay/seq``); the sender answers with a
plan or an error (``replay/<id>/plan``: the version is no longer held).

Re-forming a round without a dead engine (``control/weight_updates.py``): when an engine
counted in a version's round dies before the round completed, the control plane stages
that version again on the survivors with ``meta["reform"]`` (and ``meta["reload"]``). The
first such fetch cancels the round (``v<N>/cancel``): the sender stops waiting for joins or
aborts its collectives at once, wakes the receivers still waiting for the plan, and keeps
the version (it is not a failure: no ``errors`` entry); each survivor then receives it
alone, as a reload. So nobody waits ``join_timeout_s`` for an engine that is gone.

Every store wait and collective has a timeout (``timeout_s``; joining ``join_timeout_s``).
A failed round is reported by every side that is still alive under ``v<N>/failed/<rank>``,
so an error names the peer that did not answer. A failing receiver raises
:class:`~rollart_sdk.weights.WeightSyncError` (its engine keeps the old version); the group
is dropped and re-formed in the next round.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from rollart_sdk.types import WeightBucket, WeightManifest
from rollart_sdk.weights import WeightSyncError, bucket_ref, verify
from rollart_transport_nccl import group as pg
from rollart_transport_nccl.wire import Packed, check_header, pack, plan, unpack

TRANSPORT_NAME = "nccl"
log = logging.getLogger(__name__)
KEEP_VERSIONS = 3  # published versions the sender can replay (served, staged, newest)


REPLAY_POLL_S = 0.2  # how often the sender looks for a restarted engine's reload request

class NcclTransportOptions(BaseModel):
    """Options of ``transport: {name: nccl, options: {...}}``."""

    model_config = ConfigDict(extra="forbid")

    backend: pg.Backend = Field(
        "auto", description="process-group backend: auto (nccl with a GPU, else gloo), "
        "nccl or gloo",
    )
    host: str = Field(
        "127.0.0.1", description="address the trainer's rendezvous store listens on and "
        "advertises to engines (a routable address on a multi-node cluster)",
    )
    port: int = Field(0, ge=0, le=65535, description="store port; 0 picks a free one")
    store: str | None = Field(
        None, description="receivers: 'host:port' of the sender's store, used when a "
        "manifest does not name one",
    )
    receivers: int | None = Field(
        None, ge=1, description="engine workers in each round; default: the manifest's "
        "meta['receivers'], which the control plane sets",
    )
    timeout_s: float = Field(
        120.0, gt=0, description="seconds any one collective or store wait may take before "
        "the round fails with an error naming the peer that did not answer",
    )
    join_timeout_s: float = Field(
        300.0, gt=0, description="seconds the sender waits for every engine to join a round",
    )
    direct: bool = Field(
        True, description="engines that can (vllm, sglang) receive each round in their own "
        "worker processes, straight beside the model (the collective path); false: the "
        "engine worker receives and hands the tensors to the engine (the bytes path)",
    )


def _whoami() -> str:
    """host:pid, plus the Ray actor's name when this process is one."""
    me = f"{socket.gethostname()}:{os.getpid()}"
    ray = __import__("sys").modules.get("ray")
    if ray is not None and ray.is_initialized():
        try:
            name = ray.get_runtime_context().get_actor_name()
        except Exception:  # noqa: BLE001 - a name is a courtesy, never a failure
            name = None
        if name:
            me = f"{name} ({me})"
    return me


class NcclTransport:
    """One side of the weight-update group: ``role="sender"`` or ``role="receiver"``."""

    style: ClassVar[Literal["push", "pull"]] = "push"

    def __init__(
        self,
        role: str = "sender",
        backend: pg.Backend = "auto",
        host: str = "127.0.0.1",
        port: int = 0,
        store: str | None = None,
        receivers: int | None = None,
        timeout_s: float = 120.0,
        join_timeout_s: float = 300.0,
        direct: bool = True,
    ) -> None:
        if role not in ("sender", "receiver"):
            raise ValueError(f"role must be 'sender' or 'receiver', got {role!r}")
        self.role = role
        self.requested_backend = backend
        self.receivers = receivers
        self.timeout_s = timeout_s
        self.join_timeout_s = join_timeout_s
        self.direct = direct
        self.name = _whoami()
        self._store: Any = None
        self._group: Any = None
        self._gen = -1  # generation of the group this side holds (-1: none)
        self._rank = -1
        self._world = 0
        self._members: dict[int, str] = {}
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._round: threading.Thread | None = None
        self._last_version: int | None = None
        self._done_keys: list[str] = []
        self.errors: dict[int, WeightSyncError] = {}  # sender: failed rounds by version
        self.sent_s: dict[int, float] = {}  # sender: seconds each round took
        self.backend: str | None = None
        self.address = store
        self._held: dict[int, Packed] = {}  # sender: versions a reload can be sent
        self._held_lock = threading.Lock()
        self._replayer: threading.Thread | None = None
        self.replayed: list[int] = []  # sender: versions sent to one reloading engine
        if role == "sender":
            import torch.distributed as dist

            self.backend = pg.choose_backend(backend)
            self._store = dist.TCPStore(
                host, port, None, True, datetime.timedelta(seconds=timeout_s),
                wait_for_workers=False,
            )
            self.address = f"{host}:{self._store.port}"

    # ------------------------------------------------------------------ sender
    def publish(self, version: int, buckets: Iterable[WeightBucket]) -> WeightManifest:
        """Snapshot ``buckets`` and start the round that broadcasts them; returns at once.

        The previous round must end first (bounded by its timeouts). Its failure, if any,
        is in ``errors`` and was logged; receivers saw it as their own error.
        """
        if self.role != "sender":
            raise RuntimeError("publish is the trainer's side; this transport has "
                               f"role={self.role!r}")
        buckets = list(buckets)
        if self._last_version is not None and version <= self._last_version:
            raise ValueError(f"versions must increase: {version} after {self._last_version}")
        for b in buckets:
            if b.version != version:
                raise ValueError(f"bucket {b.index} of version {b.version} published as "
                                 f"version {version}")
        refs = [bucket_ref(b) for b in buckets]
        packed = pack(version, buckets, pg.device_for(self.backend or "gloo"))
        if not self.wait(self.join_timeout_s + 4 * self.timeout_s):
            raise WeightSyncError(version, "the previous round is still running")
        self._last_version = version
        self._hold(packed)
        meta: dict[str, Any] = {"store": self.address, "backend": self.backend}
        if self.receivers:
            meta["receivers"] = self.receivers
        manifest = WeightManifest(version, TRANSPORT_NAME, refs, meta)
        self._round = threading.Thread(target=self._send_round, args=(packed,),
                                       name=f"nccl-send-v{version}", daemon=True)
        self._round.start()
        return manifest

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait for the running round (sender); True when none is running any more."""
        thread = self._round
        if thread is not None:
            thread.join(timeout_s)
            return not thread.is_alive()
        return True

    def _send_round(self, packed: Packed) -> None:
        v, key, store = packed.version, f"v{packed.version}", self._store
        t0 = time.perf_counter()
        world = 0
        try:
            joins = self._await_joins(key)
            n = len(joins)
            world = n + 1
            reuse = (self._group is not None and self._world == world
                     and all(j["gen"] == self._gen for j in joins)
                     and sorted(j["rank"] for j in joins) == list(range(1, world)))
            if reuse:
                ranks = [j["rank"] for j in joins]
            else:
                self._gen += 1
                ranks = list(range(1, world))
            self._members = {r: j["name"] for r, j in zip(ranks, joins, strict=True)}
            store.set(f"{key}/plan", json.dumps({
                "gen": self._gen, "world": world, "ranks": ranks, "backend": self.backend,
            }))
            if not reuse:
                self._group = None
                self._group = pg.new_group(store, f"g{self._gen}/", 0, world,
                                           self.backend or "gloo", self.timeout_s)
                self._world = world
            device = pg.device_for(self.backend or "gloo")
            abort = self._watch(key, list(range(1, world)))
            self._send_payload(self._group, packed, device, abort)
            self.sent_s[v] = time.perf_counter() - t0
            if device.type != "cpu":  # kept for reloads off the device
                self._hold(Packed(v, packed.header, [f.cpu() for f in packed.flats]))
        except Exception as exc:  # noqa: BLE001 - recorded, logged, and seen by receivers
            pg.abandon(self._group)
            self._group = None
            cancelled = self._cancelled(key)
            if cancelled is not None:  # re-formed: the survivors receive it alone (kept)
                log.info("transport nccl: round of version %s cancelled: %s", v, cancelled)
                self._give_up(key, f"the round was cancelled: {cancelled}")
                return
            with self._held_lock:  # a failed version is never served: no reload asks for it
                self._held.pop(v, None)
            if self._closing.is_set():  # a version nobody fetched before the run ended
                log.info("transport nccl: round of version %s dropped at close", v)
                self._give_up(key, "the sender closed")
                return
            self._report_failure(key, 0, exc)
            err = WeightSyncError(v, f"the broadcast round failed: "
                                     f"{self._blame(key, world, exc)}")
            self._give_up(key, str(err))
            self.errors[v] = err
            log.warning("transport nccl (sender): %s", err)
        finally:
            for old in self._done_keys:
                self._delete(old)
            self._done_keys = [f"{key}/{k}" for k in ("n", "joined", "plan", "cancel")] + [
                f"{key}/who/{i}" for i in range(max(world - 1, 0))
            ]

    def _give_up(self, key: str, reason: str) -> None:
        """Wake receivers still waiting for the plan: this round will not happen."""
        try:
            if not self._store.check([f"{key}/plan"]):
                self._store.set(f"{key}/plan", json.dumps({"error": reason}))
        except Exception as exc:  # noqa: BLE001 - receivers then time out on their own
            log.debug("transport nccl: could not cancel the round: %s", exc)

    def _await_joins(self, key: str) -> list[dict[str, Any]]:
        """Wait until the round's receivers joined (their number: the option
        ``receivers``, else what the first one to join says) or it was cancelled."""
        deadline = time.monotonic() + self.join_timeout_s
        n = self.receivers
        while n is None or (joined := self._store.add(f"{key}/joined", 0)) < n:
            if self._closing.is_set():
                raise RuntimeError("the transport was closed")
            if (why := self._cancelled(key)) is not None:
                raise RuntimeError(f"the round was cancelled: {why}")
            if n is None and self._store.check([f"{key}/n"]):
                n = int(self._store.get(f"{key}/n").decode())
                continue
            if time.monotonic() > deadline:
                if n is None:
                    raise TimeoutError(f"no engine worker joined within "
                                       f"{self.join_timeout_s}s")
                names = [self._who(key, i).get("name", "?") for i in range(joined)]
                raise TimeoutError(
                    f"only {joined} of {n} engine workers joined within "
                    f"{self.join_timeout_s}s (joined: {names}); the others are dead, "
                    "stuck, or were never told to fetch this version"
                )
            time.sleep(0.01)
        return [self._who(key, i) for i in range(n)]

    def _cancelled(self, key: str) -> str | None:
        """Why the round ``key`` was cancelled (a survivor re-formed it), or None."""
        try:
            if self._store.check([f"{key}/cancel"]):
                return str(self._store.get(f"{key}/cancel").decode())
        except Exception as exc:  # noqa: BLE001 - an unreachable store cancels nothing: the
            # caller's own store calls (the join loop) or its original error (the failed
            # round it is reporting) say what went wrong
            log.debug("transport nccl: could not read %s/cancel: %s", key, exc)
        return None

    def _who(self, key: str, slot: int) -> dict[str, Any]:
        return json.loads(self._wait_get(f"{key}/who/{slot}", self.timeout_s, "an engine"))

    # ------------------------------------------------------------------ receiver
    def receiver_spec(self) -> dict[str, Any] | None:
        """How an engine's own worker process builds a receiver of the same rounds (the
        collective path, ``rollart_sdk.weights.direct``); None with ``direct=False``."""
        if not self.direct:
            return None
        return {"factory": f"{__name__}:NcclTransport", "kwargs": {
            "backend": self.requested_backend, "store": self.address,
            "receivers": self.receivers, "timeout_s": self.timeout_s,
            "join_timeout_s": self.join_timeout_s}}

    def fetch(self, manifest: WeightManifest) -> Iterator[WeightBucket]:
        """Join the version's round, receive everything, then verify and yield each bucket.

        The whole round is received before anything is checked, so a receiver that finds
        a bad bucket still completed the collectives the others are waiting on.
        """
        if manifest.transport != TRANSPORT_NAME:
            raise WeightSyncError(
                manifest.version, f"manifest of transport {manifest.transport!r} given to "
                "transport 'nccl'; sender and receivers must use the same transport",
            )
        if manifest.meta.get("reform"):
            self._cancel_round(manifest)
        if manifest.meta.get("reload"):
            # Its own store client and group: a round this receiver is still in (being
            # cancelled) holds the lock until it has given up.
            received = self._replay(manifest)
        else:
            with self._lock:
                received = self._receive(manifest)
        by_index = {b.index: b for b in received}
        for ref in manifest.buckets:
            bucket = by_index.get(ref.index)
            if bucket is None:
                raise WeightSyncError(manifest.version, "never sent", ref.index)
            verify(bucket, ref, manifest.version)
            yield bucket

    def _receive(self, manifest: WeightManifest) -> list[WeightBucket]:
        v, key = manifest.version, f"v{manifest.version}"
        n = manifest.meta.get("receivers") or self.receivers
        if not n:
            raise WeightSyncError(
                v, "the number of engines receiving this version is unknown: the control "
                "plane sets manifest.meta['receivers']; when driving the transport "
                "yourself, give it the option receivers=N",
            )
        self._connect(v, manifest.meta.get("store") or self.address)
        store, rank = self._store, -1
        try:
            store.set(f"{key}/n", str(n))
            slot = store.add(f"{key}/joined", 1) - 1
            if slot >= n:
                raise WeightSyncError(v, f"receiver {slot + 1} joined a round planned for "
                                         f"{n} (meta['receivers'] is too small)")
            store.set(f"{key}/who/{slot}", json.dumps(
                {"name": self.name, "gen": self._gen, "rank": self._rank}))
            plan_ = json.loads(self._wait_get(
                f"{key}/plan", self.join_timeout_s, "the sender (trainer rank 0)"))
            if "error" in plan_:
                raise WeightSyncError(v, f"the sender gave up on this round: {plan_['error']}")
            rank = plan_["ranks"][slot]
            self.backend = plan_["backend"]
            if plan_["gen"] != self._gen or self._group is None:
                self._group = None
                self._group = pg.new_group(store, f"g{plan_['gen']}/", rank, plan_["world"],
                                           self.backend, self.timeout_s)
                self._gen, self._rank, self._world = plan_["gen"], rank, plan_["world"]
            header, flats = self._recv_payload(self._group, pg.device_for(self.backend),
                                               self._watch(key, [0]))
        except WeightSyncError:
            self._drop_group()
            raise
        except Exception as exc:
            pg.abandon(self._group)
            self._drop_group()
            self._report_failure(key, rank, exc)
            raise WeightSyncError(v, f"receiving failed: {self._blame(key, self._world, exc)}"
                                  ) from exc
        check_header(header, manifest)
        return unpack(header, flats)

    def _connect(self, version: int, address: str | None) -> None:
        """A client of the sender's store (again when the sender moved: a new trainer)."""
        import torch.distributed as dist

        if not address:
            raise WeightSyncError(
                version, "the manifest names no rendezvous store (meta['store']) and this "
                "receiver has none (option store='host:port')",
            )
        if self._store is not None and address == self.address:
            return
        host, _, port = address.rpartition(":")
        self._drop_group()
        self._gen = self._rank = -1
        try:
            self._store = dist.TCPStore(host, int(port), None, False,
                                        datetime.timedelta(seconds=self.timeout_s))
        except Exception as exc:
            self._store = None
            raise WeightSyncError(version, f"cannot reach the sender's store at {address}: "
                                           f"{exc}") from exc
        self.address = address

    def _watch(self, key: str, ranks: list[int]) -> pg.Abort:
        """An abort check for collectives: the first failure another rank reported."""
        keys = [f"{key}/failed/{r}" for r in ranks]

        def check() -> str | None:
            if self._closing.is_set():
                return "the transport was closed"
            for k in keys:
                if self._store.check([k]):
                    return f"rank {k.rsplit('/', 1)[1]} reported: {self._store.get(k).decode()}"
            if self._store.check([f"{key}/cancel"]):
                return f"the round was cancelled: {self._store.get(f'{key}/cancel').decode()}"
            return None

        return check

    def _drop_group(self) -> None:
        self._group = None
        self._gen = -1

    # ------------------------------------------------------------------ reload (replay)
    def _hold(self, packed: Packed) -> None:
        """Keep ``packed`` for reloads (the newest KEEP_VERSIONS); start the replay thread."""
        with self._held_lock:
            self._held[packed.version] = packed
            for old in sorted(self._held)[:-KEEP_VERSIONS]:
                del self._held[old]
        if self._replayer is None:
            self._replayer = threading.Thread(target=self._serve_replays, name="nccl-replay",
                                              daemon=True)
            self._replayer.start()

    def _serve_replays(self) -> None:
        """Sender thread: answer each reload request in turn (its own store client, so a
        blocking wait never holds up a round)."""
        import torch.distributed as dist

        host, _, port = (self.address or "").rpartition(":")
        store = dist.TCPStore(host, int(port), None, False,
                              datetime.timedelta(seconds=self.timeout_s))
        rid = 1
        while not self._closing.is_set():
            # `check` asks without waiting: a timed-out `store.wait` had c10d log two
            # "waitForInput ... timed out" warnings every second of the run.
            try:
                asked = store.check([f"replay/{rid}"])
            except Exception:  # noqa: BLE001 - the store went (at close): stop asking
                asked = False
            if not asked:
                self._closing.wait(REPLAY_POLL_S)
                continue
            self._replay_one(store, rid)
            rid += 1

    def _replay_one(self, store: Any, rid: int) -> None:
        key = f"replay/{rid}"
        ask = json.loads(store.get(key))
        with self._held_lock:
            packed = self._held.get(int(ask["version"]))
        if packed is None:
            store.set(f"{key}/plan", json.dumps({"error": (
                f"version {ask['version']} is no longer held (the sender keeps the newest "
                f"{KEEP_VERSIONS}: {sorted(self._held)})")}))
            return
        backend = self.backend or "gloo"
        store.set(f"{key}/plan", json.dumps({"backend": backend}))
        group = None
        try:
            group = pg.new_group(store, f"{key}/g/", 0, 2, backend, self.timeout_s)
            device = pg.device_for(backend)
            flats = [f.to(device) for f in packed.flats]
            self._send_payload(group, Packed(packed.version, packed.header, flats), device,
                               self._abort_on(store, [f"{key}/failed/1"]))
            self.replayed.append(packed.version)
        except Exception as exc:  # noqa: BLE001 - the receiver reports its own failure
            pg.abandon(group)
            log.warning("transport nccl: reload of version %s for %s failed: %s",
                        ask["version"], ask.get("name"), exc)
            try:
                store.set(f"{key}/failed/0", f"{self.name}: {exc}"[:800])
            except Exception:  # noqa: BLE001 - the store may be what failed
                pass

    def _client(self, manifest: WeightManifest) -> Any:
        """A store client of this receiver's own (not the one its rounds use)."""
        import torch.distributed as dist

        v, address = manifest.version, manifest.meta.get("store") or self.address
        if not address:
            raise WeightSyncError(
                v, "the manifest names no rendezvous store (meta['store']) and this "
                "receiver has none (option store='host:port')",
            )
        host, _, port = address.rpartition(":")
        try:
            return dist.TCPStore(host, int(port), None, False,
                                 datetime.timedelta(seconds=self.timeout_s))
        except Exception as exc:
            raise WeightSyncError(v, f"cannot reach the sender's store at {address}: "
                                     f"{exc}") from exc

    def _cancel_round(self, manifest: WeightManifest) -> None:
        """Cancel the round of ``manifest``'s version: an engine it counted is gone, and
        every survivor receives the version alone instead (``meta["reform"]``)."""
        self._client(manifest).set(
            f"v{manifest.version}/cancel",
            f"{self.name}: an engine counted in it is down; the others receive the "
            "version alone")

    def _replay(self, manifest: WeightManifest) -> list[WeightBucket]:
        """Receiver: ask the sender for ``manifest``'s version alone (a reload)."""
        v = manifest.version
        store = self._client(manifest)
        key = f"replay/{store.add('replay/seq', 1)}"
        store.set(key, json.dumps({"version": v, "name": self.name}))
        plan_ = json.loads(self._wait_get(f"{key}/plan", self.join_timeout_s,
                                          "the sender (trainer rank 0)", store))
        if "error" in plan_:
            raise WeightSyncError(v, f"the sender cannot send it for a reload: {plan_['error']}")
        group = None
        try:
            group = pg.new_group(store, f"{key}/g/", 1, 2, plan_["backend"], self.timeout_s)
            header, flats = self._recv_payload(group, pg.device_for(plan_["backend"]),
                                               self._abort_on(store, [f"{key}/failed/0"]))
        except Exception as exc:
            pg.abandon(group)
            try:
                store.set(f"{key}/failed/1", f"{self.name}: {exc}"[:800])
            except Exception:  # noqa: BLE001 - the store may be what failed
                pass
            raise WeightSyncError(v, f"reloading failed: {exc}") from exc
        check_header(header, manifest)
        return unpack(header, flats)

    def _abort_on(self, store: Any, keys: list[str]) -> pg.Abort:
        def check() -> str | None:
            if self._closing.is_set():
                return "the transport was closed"
            for k in keys:
                if store.check([k]):
                    return f"the peer reported: {store.get(k).decode()}"
            return None

        return check

    # ------------------------------------------------------------------ both
    def _send_payload(self, group: Any, packed: Packed, device: Any, abort: pg.Abort) -> None:
        """Rank 0: the header's length, the header, every flat buffer, then a barrier."""
        import torch

        header = torch.frombuffer(bytearray(packed.header), dtype=torch.uint8).to(device)
        length = torch.tensor([header.numel()], dtype=torch.int64, device=device)
        for tensor in (length, header, *packed.flats):
            pg.broadcast(group, tensor, self.timeout_s, abort)
        pg.barrier(group, device, self.timeout_s, abort)

    def _recv_payload(self, group: Any, device: Any, abort: pg.Abort) -> tuple[dict[str, Any],
                                                                             list[Any]]:
        """The other ranks' side of :meth:`_send_payload`: the header and the flat buffers."""
        import torch

        length = torch.zeros(1, dtype=torch.int64, device=device)
        pg.broadcast(group, length, self.timeout_s, abort)
        raw = torch.empty(int(length.item()), dtype=torch.uint8, device=device)
        pg.broadcast(group, raw, self.timeout_s, abort)
        header = json.loads(bytes(raw.cpu().numpy()))
        flats = plan(header, device)
        for flat in flats:
            pg.broadcast(group, flat, self.timeout_s, abort)
        pg.barrier(group, device, self.timeout_s, abort)
        return header, flats

    def _wait_get(self, key: str, timeout_s: float, whom: str, store: Any = None) -> bytes:
        store = store if store is not None else self._store
        try:
            store.wait([key], datetime.timedelta(seconds=timeout_s))
            return store.get(key)
        except Exception as exc:
            raise TimeoutError(f"{whom} did not answer within {timeout_s}s "
                               f"(waiting for {key!r}: {exc})") from exc

    def _report_failure(self, key: str, rank: int, exc: BaseException) -> None:
        try:
            self._store.set(f"{key}/failed/{rank}", f"{self.name}: {exc}"[:800])
        except Exception as store_exc:  # noqa: BLE001 - the store may be what died
            log.debug("transport nccl: could not report a failure: %s", store_exc)

    def _blame(self, key: str, world: int, exc: BaseException) -> str:
        """Which peers reported a failure and which said nothing (dead or stuck)."""
        if world <= 1:
            return str(exc)
        deadline = time.monotonic() + min(2.0, self.timeout_s)
        silent: list[str] = []
        reported: list[str] = []
        while True:
            silent, reported = [], []
            for r in range(world):
                if r == self._rank or (self.role == "sender" and r == 0):
                    continue
                who = "the sender (trainer rank 0)" if r == 0 else (
                    f"rank {r} ({self._members.get(r, 'an engine worker')})")
                try:
                    if self._store.check([f"{key}/failed/{r}"]):
                        reason = self._store.get(f"{key}/failed/{r}").decode()
                        reported.append(f"{who} failed: {reason}")
                        continue
                except Exception:  # noqa: BLE001 - an unreachable store is a silent sender
                    pass
                silent.append(who)
            if not silent or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        parts = [f"{', '.join(silent)} did not answer (dead or stuck?)"] if silent else []
        parts += reported
        return f"{'; '.join(parts) or 'no peer reported a failure'} [{exc}]"

    def _delete(self, key: str) -> None:
        try:
            self._store.delete_key(key)
        except Exception as exc:  # noqa: BLE001 - leftover keys cost a few bytes
            log.debug("transport nccl: could not delete %s: %s", key, exc)

    def release(self, version: int) -> None:
        """Every engine moved past ``version``: no reload will ask for it."""
        self.errors.pop(version, None)
        with self._held_lock:
            self._held.pop(version, None)

    def close(self) -> None:
        self._closing.set()
        if self.role == "sender":
            self.wait(self.timeout_s)
            if self._replayer is not None:
                self._replayer.join(self.timeout_s)
        with self._held_lock:
            self._held.clear()
        self._group = None
        self._store = None
