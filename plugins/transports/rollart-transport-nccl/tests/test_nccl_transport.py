"""The "nccl" transport (gloo here): the conformance kit, then real engine-worker processes
receiving versions, dying mid-transfer, and re-joining after a restart."""

from __future__ import annotations

import multiprocessing as mp
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

# Spawned engine processes import their entry point by module name (importlib mode keeps
# this folder off sys.path otherwise; children inherit sys.path).
sys.path.insert(0, str(Path(__file__).parent))
from nccl_procs import engine_worker, fingerprints
from rollart_transport_nccl.transport import NcclTransport, NcclTransportOptions
from rollart_transport_nccl.wire import pack, unpack

from rollart_sdk.testing.transport import check_transport, make_state_dict
from rollart_sdk.weights import WeightSyncError, checksum, split_buckets

pytestmark = pytest.mark.timeout(240)
BUCKET_BYTES = 4096


def test_conformance_kit_gloo():
    torch.set_num_threads(1)
    sender = NcclTransport("sender", backend="gloo", timeout_s=30, join_timeout_s=30)
    summary = check_transport(
        lambda: sender,
        lambda: NcclTransport("receiver", store=sender.address, receivers=3, timeout_s=30,
                              join_timeout_s=30),
        num_receivers=3,
        name="nccl",
    )
    assert summary["versions"] == [1, 2] and summary["corrupt_rejected"] == "fetch"
    assert sender.backend == "gloo" and not sender.errors
    assert sorted(sender.sent_s) == [1, 2, 3]  # the corrupt round itself completed


def test_conformance_kit_on_the_collective_path():
    """The kit with engines whose own "workers" receive (rollart_sdk.weights.direct): each
    builds a receiver from receiver_spec() and joins the rounds itself; the engine
    worker's receivers never do."""
    from rollart_sdk.testing.transport import DirectRecordingEngine

    torch.set_num_threads(1)
    sender = NcclTransport("sender", backend="gloo", timeout_s=30, join_timeout_s=30)
    receivers, engines = [], []

    def receiver():
        receivers.append(NcclTransport("receiver", store=sender.address, receivers=2,
                                       timeout_s=30, join_timeout_s=30))
        return receivers[-1]

    def engine():
        engines.append(DirectRecordingEngine())
        return engines[-1]

    summary = check_transport(lambda: sender, receiver, num_receivers=2, name="nccl",
                              make_engine=engine)
    assert summary["versions"] == [1, 2] and summary["corrupt_rejected"] == "fetch"
    assert [e.staged for e in engines] == [[1, 2, 3]] * 2
    assert all(r._gen == -1 for r in receivers)  # never joined: the "workers" did
    assert sorted(sender.sent_s) == [1, 2, 3] and not sender.errors
    spec = NcclTransport("receiver", store=sender.address, direct=False).receiver_spec()
    assert spec is None  # direct=False: the bytes path


def test_wire_round_trip_keeps_every_dtype_and_shape():
    state = make_state_dict(4)
    state["mask"] = torch.tensor([True, False, True])
    state["codes"] = torch.tensor([[-3, 7]], dtype=torch.int8)
    buckets = list(split_buckets(state.items(), 1 << 20, 4))
    packed = pack(4, buckets)
    dtypes = {str(t.dtype) for t in state.values()}
    assert len(packed.flats) == len(dtypes) - 0  # one flat buffer per dtype with bytes
    import json

    header = json.loads(packed.header)
    (back,) = unpack(header, [f.clone() for f in packed.flats])
    assert sorted(back.tensors) == sorted(state)
    for name, tensor in state.items():
        got = back.tensors[name]
        assert got.dtype == tensor.dtype and got.shape == tensor.shape, name
        assert checksum({name: got}) == checksum({name: tensor}), name
    assert back.checksum == buckets[0].checksum


class Engines:
    """Engine-worker processes, each a receiver + stager + recording engine."""

    def __init__(self, store: str) -> None:
        self.store = store
        self.ctx = mp.get_context("spawn")
        self.procs: list[Any] = []
        self.conns: list[Any] = []
        self.names: list[str] = []

    def start(self, **kwargs: Any) -> int:
        parent, child = self.ctx.Pipe()
        proc = self.ctx.Process(target=engine_worker, args=(child, self.store),
                                kwargs=kwargs, daemon=True)
        proc.start()
        assert parent.poll(120), "engine process did not start"
        self.names.append(parent.recv()["name"])
        self.procs.append(proc)
        self.conns.append(parent)
        return len(self.procs) - 1

    def deliver(self, manifest, which: list[int]) -> dict[int, dict]:
        manifest.meta["receivers"] = len(which)  # what the control plane's WeightSync sets
        for i in which:
            self.conns[i].send(manifest)
        out = {}
        for i in which:
            try:
                if not self.conns[i].poll(180):
                    raise EOFError
                out[i] = self.conns[i].recv()
            except (EOFError, OSError):
                out[i] = {"ok": False, "error": "no answer", "dead": True}
        return out

    def stage(self, manifest, i: int) -> None:
        """Engine ``i`` starts receiving ``manifest`` (in the background) and answers."""
        self.conns[i].send(("stage", manifest))
        assert self.conns[i].poll(60) and self.conns[i].recv() == {"staged": manifest.version}

    def close(self) -> None:
        for conn, proc in zip(self.conns, self.procs, strict=True):
            if proc.is_alive():
                try:
                    conn.send(None)
                except OSError:
                    pass
                proc.join(30)
            if proc.is_alive():
                proc.kill()
                proc.join(10)


@pytest.fixture
def sender():
    torch.set_num_threads(1)
    s = NcclTransport("sender", backend="gloo", timeout_s=10, join_timeout_s=60)
    yield s
    s.close()


@pytest.fixture
def engines(sender):
    e = Engines(sender.address)
    yield e
    e.close()


def publish(sender: NcclTransport, version: int):
    state = make_state_dict(version)
    return sender.publish(version, split_buckets(state.items(), BUCKET_BYTES, version))


def test_processes_receive_versions_and_a_restarted_engine_rejoins(sender, engines):
    a, b = engines.start(), engines.start()
    for version in (1, 2):
        results = engines.deliver(publish(sender, version), [a, b])
        for r in results.values():
            assert r["ok"], r
            assert r["version"] == version
            assert r["fp"] == fingerprints(make_state_dict(version))
        assert sender.wait(30) and not sender.errors
    gen_before = sender._gen
    assert results[a]["gen"] == results[b]["gen"] == gen_before  # v2 reused v1's group

    # Engine b crashes between versions; its restart joins the next round with nothing.
    engines.procs[b].kill()
    engines.procs[b].join(10)
    c = engines.start()
    results = engines.deliver(publish(sender, 3), [a, c])
    assert all(r["ok"] for r in results.values()), results
    assert results[c]["version"] == 3 and results[a]["version"] == 3
    assert sender._gen == gen_before + 1  # the group was re-formed with the newcomer
    assert sender.wait(30) and not sender.errors


def test_engine_dying_mid_transfer_is_named_and_the_others_keep_their_version(
        sender, engines):
    a = engines.start()
    b = engines.start(die_at_broadcast=4)  # length, header, then dies in the flat buffers
    v1 = engines.deliver(publish(sender, 1), [a])  # b not asked: a alone
    assert v1[a]["ok"], v1
    results = engines.deliver(publish(sender, 2), [a, b])
    assert results[b].get("dead"), "the dying engine answered"
    assert not results[a]["ok"], "a survivor committed a version another engine never got"
    assert results[a]["version"] == 1
    assert results[a]["fp"] == fingerprints(make_state_dict(1))
    assert sender.wait(60)
    err = sender.errors[2]
    assert isinstance(err, WeightSyncError) and err.version == 2
    assert engines.names[b] in str(err) and "did not answer" in str(err)
    # The run goes on: the next version reaches the survivor.
    results = engines.deliver(publish(sender, 3), [a])
    assert results[a]["ok"] and results[a]["version"] == 3, results


def test_a_restarted_engine_reloads_a_version_the_others_already_have(sender, engines):
    """EngineRecovery's reload: the sender sends a held version to that one engine
    (``meta["reload"]``), beside the rounds, and it rejoins the next round as usual."""
    import dataclasses

    a, b = engines.start(), engines.start()
    v1 = publish(sender, 1)
    assert all(r["ok"] for r in engines.deliver(v1, [a, b]).values())
    engines.procs[b].kill()
    engines.procs[b].join(10)
    # The next round goes on with the live engine only.
    v2 = publish(sender, 2)
    assert engines.deliver(v2, [a])[a]["ok"]
    assert sender.wait(30) and not sender.errors
    c = engines.start()  # the restart: initial weights; loads the served version 2 alone
    reload = dataclasses.replace(v2, meta={**v2.meta, "receivers": 1, "reload": True})
    got = engines.deliver(reload, [c])[c]
    assert got["ok"] and got["version"] == 2, got
    assert got["fp"] == fingerprints(make_state_dict(2))
    assert sender.replayed == [2]
    # Back among the receivers: the group is re-formed with it.
    results = engines.deliver(publish(sender, 3), [a, c])
    assert all(r["ok"] and r["version"] == 3 for r in results.values()), results
    # A version the sender no longer holds (released) is a clear error, not a hang.
    sender.release(1)
    reload1 = dataclasses.replace(v1, meta={**v1.meta, "receivers": 1, "reload": True})
    got = engines.deliver(reload1, [c])[c]
    assert not got["ok"] and "no longer held" in got["error"], got
    assert got["version"] == 3  # it keeps what it has


def test_a_round_re_formed_without_a_dead_engine_is_not_waited_out(sender, engines):
    """An engine counted in a round dies before joining it: the survivor, staged again
    with ``meta["reform"]`` (control/weight_updates.py), cancels the round and receives
    the version alone. The sender records no failure and keeps the version, so the
    restarted engine reloads it later; the next round goes on with the survivor."""
    import dataclasses
    import time

    a, b = engines.start(), engines.start()
    assert all(r["ok"] for r in engines.deliver(publish(sender, 1), [a, b]).values())
    v2 = publish(sender, 2)
    v2.meta["receivers"] = 2  # staged to both ...
    engines.stage(v2, a)
    engines.procs[b].kill()  # ... and b dies before it joined
    engines.procs[b].join(10)
    deadline = time.monotonic() + 60  # a has joined; the sender waits for b
    while sender._store.add("v2/joined", 0) < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sender._store.add("v2/joined", 0) == 1
    reform = dataclasses.replace(v2, meta={**v2.meta, "reload": True, "reform": True})
    got = engines.deliver(reform, [a])[a]
    assert got["ok"] and got["version"] == 2, got
    assert got["fp"] == fingerprints(make_state_dict(2))
    # The round ended (cancelled, long before join_timeout_s=60) without a failure.
    assert sender.wait(30) and sender.errors == {}
    assert sender.replayed == [2] and 2 in sender._held
    c = engines.start()  # b's restart reloads the version the survivor serves
    reload = dataclasses.replace(v2, meta={**v2.meta, "receivers": 1, "reload": True})
    got = engines.deliver(reload, [c])[c]
    assert got["ok"] and got["version"] == 2, got
    results = engines.deliver(publish(sender, 3), [a, c])
    assert all(r["ok"] and r["version"] == 3 for r in results.values()), results
    assert sender.wait(30) and sender.errors == {}


def test_a_missing_engine_fails_the_round_in_bounded_time():
    torch.set_num_threads(1)
    sender = NcclTransport("sender", backend="gloo", timeout_s=5, join_timeout_s=3)
    receiver = NcclTransport("receiver", timeout_s=5, join_timeout_s=30)
    manifest = publish(sender, 1)
    manifest.meta["receivers"] = 2  # a second engine that never comes
    with pytest.raises(WeightSyncError, match="only 1 of 2 engine workers joined"):
        list(receiver.fetch(manifest))
    assert sender.wait(10)
    assert "only 1 of 2" in str(sender.errors[1])
    sender.close()


def test_receiver_errors_are_clear():
    receiver = NcclTransport("receiver")
    state = make_state_dict(1)
    from rollart_sdk.weights import plan_manifest

    manifest = plan_manifest(1, "nccl", split_buckets(state.items(), BUCKET_BYTES, 1))
    with pytest.raises(WeightSyncError, match="receivers"):
        list(receiver.fetch(manifest))
    manifest.meta["receivers"] = 1
    with pytest.raises(WeightSyncError, match="no rendezvous store"):
        list(receiver.fetch(manifest))
    manifest.transport = "ray"
    with pytest.raises(WeightSyncError, match="same transport"):
        list(receiver.fetch(manifest))
    with pytest.raises(RuntimeError, match="role='receiver'"):
        receiver.publish(1, [])
    with pytest.raises(ValueError, match="role"):
        NcclTransport("trainer")


def test_backend_choice_and_registration(register_plugin):
    import rollart_transport_nccl.plugin as plugin
    from rollart_transport_nccl.group import choose_backend

    assert choose_backend("gloo") == "gloo"
    if not torch.cuda.is_available():
        assert choose_backend("auto") == "gloo"
        with pytest.raises(RuntimeError, match="backend=gloo"):
            choose_backend("nccl")
    desc = register_plugin(plugin, name="rollart-transport-nccl").registry.get(
        "transport", "nccl")
    opts = desc.validate_options({"backend": "gloo", "timeout_s": 5})
    assert isinstance(opts, NcclTransportOptions) and opts.timeout_s == 5
    transport = desc.create({"backend": "gloo"}, role="sender")
    try:
        assert transport.style == "push" and transport.address.startswith("127.0.0.1:")
    finally:
        transport.close()
    from rollart_sdk.errors import ConfigError

    with pytest.raises(ConfigError, match="backend"):
        desc.validate_options({"backend": "mpi"})


def test_listed_by_rollart_plugins():
    from rollart_sdk.plugins import load_plugins

    desc = load_plugins().registry.get("transport", "nccl")
    assert desc.distribution == "rollart-transport-nccl"


def test_an_idle_sender_logs_nothing(capfd):
    """The sender's reload thread looks for requests without a timed-out store wait: c10d
    logged two "waitForInput ... timed out" warnings a second for as long as a run went
    on (a Ray run's driver log was full of them)."""
    import time

    # receivers=1, none joining: the round polls the join count (no store wait either)
    sender = NcclTransport("sender", backend="gloo", receivers=1, timeout_s=30,
                           join_timeout_s=30)
    try:
        sender.publish(1, split_buckets(make_state_dict(1).items(), BUCKET_BYTES, 1))
        time.sleep(3.5)  # a few of the old 1 s waits
        err = capfd.readouterr().err
    finally:
        sender.close()
    assert sender._replayer is not None and "waitForInput" not in err, err[-2000:]
