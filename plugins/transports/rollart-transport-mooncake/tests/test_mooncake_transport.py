"""The "mooncake" transport on a real mooncake_master over TCP on 127.0.0.1: the conformance
kit, layout, versions pulled through stagers, a removed key and a killed trainer."""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing as mp
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # spawned children import mooncake_procs
from mooncake_procs import trainer
from rollart_transport_mooncake.transport import (
    MooncakeTransport,
    MooncakeTransportOptions,
)

from rollart_sdk.testing.transport import (
    RecordingEngine,
    check_transport,
    make_state_dict,
)
from rollart_sdk.weights import WeightSyncError, checksum, split_buckets

try:
    from rollart_sdk.weights import WeightStager
except ImportError:  # before the weights/ package move
    from rollart_sdk.weights import WeightStager

pytestmark = pytest.mark.timeout(300)
BUCKET_BYTES = 4096


def fingerprints(state: dict) -> dict[str, str]:
    return {k: checksum({k: v}) for k, v in state.items()}


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


def test_conformance_kit():
    sender = MooncakeTransport("sender", object_mb=0.01)  # several objects per version
    summary = check_transport(
        lambda: sender, lambda: MooncakeTransport("receiver", fetch_timeout_s=60),
        num_receivers=2,
    )
    assert summary["versions"] == [1, 2] and summary["corrupt_rejected"] == "fetch"
    assert "gone" in summary["released_error"]
    # the default keep_versions (3) keeps the served version for a restarted engine
    assert summary["served_kept"] == 4 and sender.keep_versions == 3


def test_buckets_are_packed_into_objects_of_the_configured_size():
    sender = MooncakeTransport("sender", object_mb=0.01)  # 10 KiB objects
    state = make_state_dict(1)
    buckets = list(split_buckets(state.items(), 4096, 1))
    objects, refs = sender._layout(1, buckets)
    assert 1 < len(objects) < len(buckets)  # buckets share objects, within the bound
    assert all(size <= sender.object_bytes for size, _ in objects[:-1] if len(_) > 1)
    for _, members in objects:
        assert all(offset % 64 == 0 for _, offset in members)
    assert [r.index for r in refs] == [b.index for b in buckets]
    big = MooncakeTransport("sender")  # default: 1 GB objects, one per small version
    assert big.object_bytes == 1 << 30
    assert len(big._layout(1, buckets)[0]) == 1


def deliver(stagers, engines, manifest):
    async def go():
        for s in stagers:
            s.start(manifest)
        out = []
        for s, e in zip(stagers, engines, strict=True):
            try:
                out.append(await s.commit(e, timeout_s=120))
            except WeightSyncError as exc:
                out.append(exc)
        return out

    return asyncio.run(go())


@pytest.fixture
def trainer_process():
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=trainer, args=(child, BUCKET_BYTES), daemon=True)
    proc.start()
    yield proc, parent
    if proc.is_alive():
        parent.send(None)
        proc.join(60)
    if proc.is_alive():
        proc.kill()


def test_engines_pull_from_a_trainer_process_and_survive_its_death(trainer_process):
    proc, conn = trainer_process
    receivers = [MooncakeTransport("receiver", fetch_timeout_s=30) for _ in range(2)]
    stagers = [WeightStager(r) for r in receivers]
    engines = [RecordingEngine() for _ in receivers]
    try:
        for version in (1, 2):
            conn.send(version)
            assert conn.poll(120), "trainer did not publish"
            manifest = conn.recv()
            assert manifest.meta["master"].startswith("127.0.0.1:")
            reports = deliver(stagers, engines, manifest)
            assert all(not isinstance(r, Exception) for r in reports), reports
            for engine in engines:
                assert engine.version == version
                assert fingerprints(engine.tensors) == fingerprints(make_state_dict(version))
        conn.send(3)
        assert conn.poll(120)
        v3 = conn.recv()
        # Peer killed: the trainer dies (its master and its segment with it) before the
        # engines pulled version 3.
        proc.kill()
        proc.join(30)
        reports = deliver(stagers, engines, v3)
        for report, engine in zip(reports, engines, strict=True):
            assert isinstance(report, WeightSyncError) and report.version == 3, report
            assert engine.version == 2
            assert fingerprints(engine.tensors) == fingerprints(make_state_dict(2))
    finally:
        for s in stagers:
            s.close()
        for r in receivers:
            r.close()


def test_a_removed_key_fails_every_engine_cleanly_and_the_next_version_lands():
    sender = MooncakeTransport("sender", object_mb=0.01)
    receivers = [MooncakeTransport("receiver", fetch_timeout_s=30) for _ in range(2)]
    stagers = [WeightStager(r) for r in receivers]
    engines = [RecordingEngine() for _ in receivers]
    try:
        def publish(v):
            state = make_state_dict(v)
            return sender.publish(v, split_buckets(state.items(), BUCKET_BYTES, v))

        assert all(not isinstance(r, Exception) for r in deliver(stagers, engines, publish(1)))
        manifest = publish(2)
        key = manifest.meta["objects"][-1][0]
        assert sender._client.remove(key, True) == 0  # one object vanishes mid-version
        for report, engine in zip(deliver(stagers, engines, manifest), engines, strict=True):
            assert isinstance(report, WeightSyncError) and key in str(report)
            assert engine.version == 1
            assert fingerprints(engine.tensors) == fingerprints(make_state_dict(1))
        reports = deliver(stagers, engines, publish(3))
        assert all(not isinstance(r, Exception) for r in reports), reports
        assert [e.version for e in engines] == [3, 3]
        assert sender.published_versions == [1, 2, 3]  # keep_versions=3 by default
    finally:
        for s in stagers:
            s.close()
        for r in receivers:
            r.close()
        sender.close()


class StallingClient:
    """A real store client whose ``batch_get_into`` of a held version waits for the test to
    release it, then runs for real (into the real registered buffers)."""

    def __init__(self, client, hold):
        self._client, self._hold = client, hold
        self.unregistered: list[int] = []
        self.closed = False
        self.entered: set[str] = set()  # held tags whose get has started

    def __getattr__(self, name):
        return getattr(self._client, name)

    def batch_get_into(self, keys, ptrs, sizes):
        for tag, gate in self._hold.items():
            if tag in keys[0]:
                self.entered.add(tag)
                assert gate.wait(120), "the test never released the stuck get"
        return self._client.batch_get_into(keys, ptrs, sizes)

    def unregister_buffer(self, ptr):
        self.unregistered.append(ptr)
        return self._client.unregister_buffer(ptr)

    def close(self):
        self.closed = True
        return self._client.close()


def stall_gets(monkeypatch, hold):
    """Every store client connected from now on is a StallingClient holding ``hold``'s
    tags (version key fragment -> the Event that releases its get)."""
    from rollart_transport_mooncake import store

    connect = store.connect

    def stalling_connect(*args, **kwargs):
        client, name = connect(*args, **kwargs)
        return StallingClient(client, hold), name

    monkeypatch.setattr(store, "connect", stalling_connect)


def until(predicate, timeout_s=30.0):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_timed_out_get_keeps_its_buffers_until_it_returns_then_releases_them(monkeypatch):
    hold = {"/v2/": threading.Event(), "/v5/": threading.Event()}
    stall_gets(monkeypatch, hold)
    sender = MooncakeTransport("sender", object_mb=0.01)
    receiver = MooncakeTransport("receiver", fetch_timeout_s=30)

    def publish(v):
        state = make_state_dict(v)
        return sender.publish(v, split_buckets(state.items(), BUCKET_BYTES, v))

    def fetch(manifest, timeout_s=30.0):
        receiver.fetch_timeout_s = timeout_s
        buckets = list(receiver.fetch(manifest))
        got = {k: t for b in buckets for k, t in b.tensors.items()}
        assert fingerprints(got) == fingerprints(make_state_dict(manifest.version))

    try:
        fetch(publish(1))  # parity 1
        client = receiver._client
        with pytest.raises(WeightSyncError, match="within 1.0s") as err:
            fetch(publish(2), timeout_s=1.0)  # parity 0: its get sticks
        assert err.value.version == 2
        assert receiver.abandoned_transfers == 1 and receiver.abandoned_bytes > 0
        stuck = [b.data_ptr() for b in receiver._abandoned[0].buffers]
        assert not set(stuck) & set(client.unregistered)  # still registered, still held
        fetch(publish(3))  # parity 1: its set is still there, no new buffers needed
        # parity 0 needs a new set, but the budget (two sets) is spent: it waits within
        # its own timeout for the stuck get, then fails saying so.
        v4 = publish(4)
        t0 = time.monotonic()
        with pytest.raises(WeightSyncError, match="still stuck.*version 2"):
            fetch(v4, timeout_s=1.0)
        assert 0.9 < time.monotonic() - t0 < 20
        assert receiver.abandoned_transfers == 1 and 0 not in receiver._slots
        hold["/v2/"].set()  # the store delivers at last: the set is unregistered, dropped
        until(lambda: receiver.abandoned_transfers == 0)
        assert set(stuck) <= set(client.unregistered) and receiver.abandoned_released == 1
        until(lambda: not any(t.name == "mooncake-get-v2" for t in threading.enumerate()))
        fetch(v4)  # and the next fetch of that parity works
        # Closed while a get is stuck: neither its buffers nor the client are released
        # under it; both are once it returns.
        with pytest.raises(WeightSyncError, match="within 1.0s"):
            fetch(publish(5), timeout_s=1.0)
        stuck = [b.data_ptr() for b in receiver._abandoned[0].buffers]
        receiver.close()
        assert receiver._client is None and not client.closed
        assert receiver.abandoned_transfers == 1
        assert not set(stuck) & set(client.unregistered)
        hold["/v5/"].set()
        until(lambda: client.closed)
        assert receiver.abandoned_transfers == 0 and set(stuck) <= set(client.unregistered)
        assert receiver.abandoned_released == 2
    finally:
        for gate in hold.values():
            gate.set()
        receiver.close()
        sender.close()


def test_two_fetches_never_share_a_buffer_set_and_close_waits_out_a_live_get(monkeypatch):
    """A fetch of v + 2 while the fetch of v (same parity, same buffers) is still in its get
    waits within its own timeout, then fails naming v; once v's get returns both work. A
    receiver closed during a live get (not timed out) keeps that get's buffers registered
    and its client open until the get returns."""
    hold = {"/v3/": threading.Event(), "/v7/": threading.Event()}
    stall_gets(monkeypatch, hold)
    sender = MooncakeTransport("sender", object_mb=0.01, keep_versions=8)
    receiver = MooncakeTransport("receiver", fetch_timeout_s=60)
    manifests = {}

    def publish(v):
        state = make_state_dict(v)
        manifests[v] = sender.publish(v, split_buckets(state.items(), BUCKET_BYTES, v))
        return manifests[v]

    def fetch(v, timeout_s=60.0):
        receiver.fetch_timeout_s = timeout_s
        got = {k: t.clone() for b in receiver.fetch(manifests[v]) for k, t in b.tensors.items()}
        assert fingerprints(got) == fingerprints(make_state_dict(v)), v
        return v

    pool = concurrent.futures.ThreadPoolExecutor(2)
    try:
        for v in (1, 3, 5, 7):
            publish(v)
        fetch(1)  # parity 1's buffers exist
        client = receiver._client
        slow = pool.submit(fetch, 3)  # parity 1: its get is held
        until(lambda: "/v3/" in client.entered)
        with pytest.raises(WeightSyncError, match="in use by the fetch of version 3"):
            fetch(5, timeout_s=1.0)  # the same buffers: refused, not overwritten
        assert not slow.done()
        hold["/v3/"].set()
        assert slow.result(timeout=60) == 3  # v3's tensors were not clobbered by v5
        fetch(5)  # and v5 gets the set once v3 let go of it
        assert receiver.abandoned_transfers == 0

        live = pool.submit(fetch, 7)  # parity 1 again; closed under its live get
        until(lambda: "/v7/" in client.entered)
        buffers = [b.data_ptr() for b in receiver._slots[1]]
        receiver.close()
        assert receiver._client is None and not client.closed
        assert receiver.abandoned_transfers == 1
        assert not set(buffers) & set(client.unregistered)  # still registered under it
        hold["/v7/"].set()
        until(lambda: client.closed)
        assert set(buffers) <= set(client.unregistered) and receiver.abandoned_transfers == 0
        assert live.result(timeout=60) == 7  # the buffers stayed valid for it
    finally:
        for gate in hold.values():
            gate.set()
        pool.shutdown(wait=True)
        receiver.close()
        sender.close()


def test_options_and_registration(register_plugin):
    import rollart_transport_mooncake.plugin as plugin

    desc = register_plugin(plugin, name="rollart-transport-mooncake").registry.get(
        "transport", "mooncake")
    opts = desc.validate_options({"object_mb": 256})
    assert isinstance(opts, MooncakeTransportOptions) and opts.object_mb == 256
    assert MooncakeTransportOptions().object_mb == 1024 and opts.host == "127.0.0.1"
    transport = desc.create({}, role="receiver")
    assert transport.style == "pull" and transport.role == "receiver"
    from rollart_sdk.errors import ConfigError

    with pytest.raises(ConfigError, match="keep_versions"):
        desc.validate_options({"keep_versions": 0})
    with pytest.raises(ValueError, match="metadata_server"):
        MooncakeTransport("receiver", master="127.0.0.1:1")
    with pytest.raises(RuntimeError, match="role='receiver'"):
        transport.publish(1, [])


def test_listed_by_rollart_plugins():
    from rollart_sdk.plugins import load_plugins

    desc = load_plugins().registry.get("transport", "mooncake")
    assert desc.distribution == "rollart-transport-mooncake"


def test_attaches_to_a_running_master():
    from rollart_transport_mooncake.store import Master

    master = Master.start("127.0.0.1")
    opts = {"master": master.address, "metadata_server": master.metadata, "object_mb": 0.01}
    sender = MooncakeTransport("sender", **opts)
    receiver = MooncakeTransport("receiver", **opts)
    stager = WeightStager(receiver)
    engine = RecordingEngine()
    try:
        state = make_state_dict(1)
        manifest = sender.publish(1, split_buckets(state.items(), BUCKET_BYTES, 1))
        assert manifest.meta["master"] == master.address
        (report,) = deliver([stager], [engine], manifest)
        assert not isinstance(report, Exception), report
        assert fingerprints(engine.tensors) == fingerprints(state)
        sender.close()
        assert master.process is not None and master.process.poll() is None  # not ours
    finally:
        stager.close()
        receiver.close()
        sender.close()
        master.stop()


def test_the_masters_ports_are_distinct_and_a_taken_port_is_tried_again(monkeypatch):
    from rollart_transport_mooncake import store

    # Chosen one after another, the kernel may hand a port out twice (a CI run's master
    # got its metrics port equal to its metadata port): held until all are chosen.
    for _ in range(20):
        ports = store.free_ports("127.0.0.1", 3)
        assert len(set(ports)) == 3, ports
    # A master that lost a port meanwhile is started again on new ones, at most 3 times.
    tries = []

    def lose(host, timeout_s):
        tries.append(host)
        if len(tries) < 3:
            raise store.PortTaken("mooncake_master did not come up: Address already in use")
        return "started"

    monkeypatch.setattr(store.Master, "_start", classmethod(lambda cls, h, t: lose(h, t)))
    assert store.Master.start("127.0.0.1") == "started" and len(tries) == 3
    tries.clear()
    monkeypatch.setattr(store.Master, "_start", classmethod(
        lambda cls, h, t: (_ for _ in ()).throw(store.PortTaken("taken"))))
    with pytest.raises(store.PortTaken):
        store.Master.start("127.0.0.1")
    # A real master still starts and answers.
    monkeypatch.undo()
    master = store.Master.start("127.0.0.1")
    try:
        host, port = master.address.rsplit(":", 1)
        assert store._reachable(host, int(port))
    finally:
        master.stop()
