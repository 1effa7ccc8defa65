"""The "ray" transport with real Ray actors: a sender actor, receiver actors, the driver
passing manifests between them (as the training protocol does)."""

from __future__ import annotations

import time

import pytest
import ray
import torch
from rollart_transport_ray.transport import (
    PackedBucket,
    RayObjectStoreTransport,
    RayTransportOptions,
    pack,
    unpack,
)

from rollart_sdk.ray_utils import init_ray
from rollart_sdk.testing.transport import RecordingEngine, check_transport, make_state_dict
from rollart_sdk.types import WeightBucket
from rollart_sdk.weights import (
    CorruptBucketError,
    WeightStager,
    WeightSyncError,
    checksum,
    split_buckets,
)

BUCKET_BYTES = 4096


@pytest.fixture(scope="module", autouse=True)
def ray_session():
    torch.set_num_threads(1)
    init_ray(num_cpus=2)
    yield
    ray.shutdown()


def fingerprints(state: dict) -> dict[str, str]:
    return {k: checksum({k: v}) for k, v in state.items()}


@ray.remote(num_cpus=0)
class Sender:
    """Trainer side: exports a version into buckets and publishes it."""

    def __init__(self, keep_versions: int = 2) -> None:
        torch.set_num_threads(1)
        self.transport = RayObjectStoreTransport("sender", keep_versions=keep_versions)

    def publish(self, version: int):
        state = make_state_dict(version)
        return self.transport.publish(
            version, split_buckets(state.items(), BUCKET_BYTES, version)
        )

    def publish_corrupted_in_store(self, version: int, victim: int, stale: bool = False):
        """Publish, then swap one stored bucket for damaged bytes (or an older version's
        bucket) under the same manifest entry, as a bit flip or mix-up in the store would."""
        manifest = self.publish(version)
        ref = manifest.buckets[victim]
        good = unpack(ray.get(ref.handle))
        if stale:
            older = list(split_buckets(make_state_dict(version - 1).items(), BUCKET_BYTES,
                                       version - 1))
            bad = older[victim]
        else:
            tensors = {k: v.clone() for k, v in good.tensors.items()}
            first = next(k for k, v in tensors.items() if v.numel() > 0)
            tensors[first].view(-1)[0] += 1
            bad = WeightBucket(version, good.index, tensors, good.checksum)
        ref.handle = ray.put(pack(bad))
        self.transport._published[version].append(ref.handle)
        return manifest

    def release(self, version: int) -> None:
        self.transport.release(version)

    def published(self) -> list[int]:
        return self.transport.published_versions


@ray.remote(num_cpus=0)
class Receiver:
    """Engine-worker side: a stager in front of a recording engine."""

    def __init__(self) -> None:
        torch.set_num_threads(1)
        self.transport = RayObjectStoreTransport("receiver", fetch_timeout_s=30)
        self.stager = WeightStager(self.transport)
        self.engine = RecordingEngine()

    def start(self, manifest) -> None:
        self.stager.start(manifest)

    async def commit(self) -> dict:
        try:
            report = await self.stager.commit(self.engine, timeout_s=60)
        except WeightSyncError as exc:
            return {"ok": False, "error": str(exc), "version": exc.version,
                    "bucket": exc.bucket, "corrupt": isinstance(exc, CorruptBucketError)}
        return {"ok": True, "report": report}

    def state(self) -> tuple[int, dict[str, str]]:
        return self.engine.version, fingerprints(self.engine.tensors)


def deliver(receivers, manifest) -> list[dict]:
    ray.get([r.start.remote(manifest) for r in receivers], timeout=60)
    return ray.get([r.commit.remote() for r in receivers], timeout=120)


def test_conformance_kit():
    summary = check_transport(
        lambda: RayObjectStoreTransport("sender"),
        lambda: RayObjectStoreTransport("receiver", fetch_timeout_s=30),
    )
    assert summary["versions"] == [1, 2]
    assert summary["corrupt_rejected"] == "fetch"
    assert "released" in summary["released_error"]


def test_actors_receive_whole_versioned_buckets():
    sender = Sender.remote()
    receivers = [Receiver.remote() for _ in range(2)]
    for version in (1, 2):
        manifest = ray.get(sender.publish.remote(version), timeout=60)
        assert manifest.version == version and manifest.transport == "ray"
        assert len(manifest.buckets) >= 3
        assert all(isinstance(b.handle, ray.ObjectRef) for b in manifest.buckets)
        results = deliver(receivers, manifest)
        expected = fingerprints(make_state_dict(version))
        for result, receiver in zip(results, receivers, strict=True):
            assert result["ok"], result
            report = result["report"]
            assert report.version == version and report.nbytes == manifest.nbytes
            assert report.transfer_s > 0 and report.exposed_s > 0
            got_version, got = ray.get(receiver.state.remote())
            assert got_version == version
            assert got == expected


def test_old_versions_are_released_and_fail_clearly():
    sender = Sender.remote(keep_versions=2)
    receiver = Receiver.remote()
    manifests = {v: ray.get(sender.publish.remote(v), timeout=60) for v in (1, 2, 3)}
    assert ray.get(sender.published.remote()) == [2, 3]

    (result,) = deliver([receiver], manifests[1])
    assert not result["ok"] and result["version"] == 1
    assert "released" in result["error"] and "keep_versions" in result["error"]
    assert ray.get(receiver.state.remote())[0] == 0  # nothing loaded

    (result,) = deliver([receiver], manifests[2])  # still kept
    assert result["ok"], result

    ray.get(sender.release.remote(3))
    assert ray.get(sender.published.remote()) == [2]
    (result,) = deliver([receiver], manifests[3])
    assert not result["ok"] and "released" in result["error"]
    assert ray.get(receiver.state.remote())[0] == 2


@pytest.mark.parametrize("stale", [False, True], ids=["corrupt-bytes", "stale-version"])
def test_corrupt_bucket_in_store_is_rejected(stale):
    sender = Sender.remote()
    receivers = [Receiver.remote() for _ in range(2)]
    assert all(r["ok"] for r in deliver(receivers, ray.get(sender.publish.remote(1))))
    victim = 1
    bad = ray.get(sender.publish_corrupted_in_store.remote(2, victim, stale), timeout=60)
    results = deliver(receivers, bad)
    v1 = fingerprints(make_state_dict(1))
    for result, receiver in zip(results, receivers, strict=True):
        assert not result["ok"], "a damaged bucket was committed"
        assert result["corrupt"] and result["version"] == 2 and result["bucket"] == victim
        assert ("stale" in result["error"]) if stale else ("corrupt" in result["error"])
        assert ray.get(receiver.state.remote()) == (1, v1)  # old version, untouched


def test_dead_sender_fails_fetch_clearly():
    sender = Sender.remote()
    manifest = ray.get(sender.publish.remote(1), timeout=60)
    ray.kill(sender, no_restart=True)
    transport = RayObjectStoreTransport("receiver", fetch_timeout_s=20)
    deadline = time.monotonic() + 30
    error: WeightSyncError | None = None
    while time.monotonic() < deadline:  # the owner's death takes a moment to be noticed
        try:
            list(transport.fetch(manifest))
        except WeightSyncError as exc:
            error = exc
            break
        time.sleep(0.2)
    assert error is not None, "fetch kept succeeding after the sender died"
    # The death may be noticed partway through a fetch: the error names the version and
    # the bucket it failed on, whichever that was (CI once failed at bucket 2 of 3).
    assert error.version == 1 and 0 <= error.bucket < len(manifest.buckets), error
    assert "died" in str(error) or "gone" in str(error)


def test_publish_and_role_errors():
    sender = RayObjectStoreTransport("sender")
    receiver = RayObjectStoreTransport("receiver")
    state = make_state_dict(1)
    with pytest.raises(RuntimeError, match="role='receiver'"):
        receiver.publish(1, split_buckets(state.items(), BUCKET_BYTES, 1))
    with pytest.raises(ValueError, match="bucket 0 of version 1"):
        sender.publish(2, split_buckets(state.items(), BUCKET_BYTES, 1))
    manifest = sender.publish(5, split_buckets(state.items(), BUCKET_BYTES, 5))
    with pytest.raises(ValueError, match="versions must increase"):
        sender.publish(4, split_buckets(state.items(), BUCKET_BYTES, 4))
    manifest.transport = "nccl"
    with pytest.raises(WeightSyncError, match="same transport"):
        list(receiver.fetch(manifest))
    sender.close()
    assert sender.published_versions == []
    with pytest.raises(ValueError):
        RayObjectStoreTransport("trainer")


def test_options_and_registration(register_plugin):
    import rollart_transport_ray.plugin as plugin

    desc = register_plugin(plugin, name="rollart-transport-ray").registry.get("transport", "ray")
    # 5, not the default 3: an option dropped on the way in would show
    opts = desc.validate_options({"keep_versions": 5})
    assert opts.keep_versions == 5 and isinstance(opts, RayTransportOptions)
    transport = desc.create({"keep_versions": 5}, role="receiver")
    assert isinstance(transport, RayObjectStoreTransport) and transport.style == "pull"
    assert transport.keep_versions == 5 and transport.role == "receiver"
    from rollart_sdk.errors import ConfigError

    with pytest.raises(ConfigError, match="keep_versions"):
        desc.validate_options({"keep_versions": 0})
    with pytest.raises(ConfigError, match="allowed keys"):
        desc.validate_options({"keep": 1})


def test_the_store_holds_numpy_bytes_and_receivers_get_tensors_they_own():
    """A bucket goes into the object store as numpy arrays (Ray keeps them out of band),
    not as pickled torch tensors (``torch.save`` on both sides, about half of the trainer's
    CPU while publishing SmolLM2); every dtype and shape comes back bit for bit, and the
    receiver's tensors are its own (writing one changes neither the store nor a later
    fetch)."""
    state = {
        "f32": torch.randn(3, 5),
        "bf16": torch.randn(4, 2).to(torch.bfloat16),
        "f16": torch.randn(7).to(torch.float16),
        "i64": torch.arange(6).reshape(2, 3),
        "flag": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 4),
        "strided": torch.randn(4, 6).t(),  # not contiguous
    }
    sender = RayObjectStoreTransport("sender")
    manifest = sender.publish(1, split_buckets(state.items(), 1 << 20, 1))
    stored = [ray.get(ref.handle) for ref in manifest.buckets]
    assert all(isinstance(p, PackedBucket) for p in stored)
    assert all(type(a).__name__ == "ndarray" for p in stored for a in p.data)
    receiver = RayObjectStoreTransport("receiver", fetch_timeout_s=30)
    got = {k: v for b in receiver.fetch(manifest) for k, v in b.tensors.items()}
    assert got.keys() == state.keys()
    for name, tensor in state.items():
        assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape, name
        assert torch.equal(got[name], tensor), name
    got["f32"].add_(1.0)  # writable, and a copy
    again = {k: v for b in receiver.fetch(manifest) for k, v in b.tensors.items()}
    assert torch.equal(again["f32"], state["f32"])
    sender.close()


def test_a_receiver_reuses_its_buffer_only_when_nothing_holds_the_last_version():
    """With ``reuse_receive_buffers`` (default) a receiver copies a version's buckets into
    the buffers of the last one once no tensor of it is held (no fresh pages per update);
    a tensor still held, or a view or numpy array of one, keeps its buffer untouched and
    the new version goes into a new one; with the option off every fetch takes new
    buffers."""
    import gc

    sender = RayObjectStoreTransport("sender", keep_versions=4)
    states = {v: {"w": torch.full((64, 8), float(v)),
                  "b": torch.arange(5, dtype=torch.bfloat16) * v,
                  "flag": torch.tensor([v % 2 == 0, True])} for v in (1, 2, 3, 4)}
    manifests = {v: sender.publish(v, split_buckets(states[v].items(), 1 << 20, v))
                 for v in states}
    receiver = RayObjectStoreTransport("receiver", fetch_timeout_s=30)

    def fetch(v: int) -> dict[str, torch.Tensor]:
        got = {k: t for b in receiver.fetch(manifests[v]) for k, t in b.tensors.items()}
        for name, want in states[v].items():
            assert torch.equal(got[name], want), (v, name)
        return got

    def buffers() -> list[int]:  # where the receiver's buffers are
        return [b.data_ptr() for b in receiver._buffers.values()]

    got = fetch(1)
    first = buffers()
    assert len(first) == 1  # one bucket, one buffer
    del got
    gc.collect()
    fetch(2)  # nothing of version 1 held: its buffer again
    assert buffers() == first
    held = fetch(3)  # the caller keeps version 3's tensors ...
    view = held["w"][:2]
    array = held["flag"].numpy()
    del held
    fetch(4)  # ... through a view and a numpy array: version 4 goes elsewhere
    assert buffers() != first  # (the first buffer is alive: the view holds it)
    assert torch.equal(view, torch.full((2, 8), 3.0)) and array.tolist() == [False, True]

    plain = RayObjectStoreTransport("receiver", fetch_timeout_s=30,
                                    reuse_receive_buffers=False)
    for v in (1, 2):
        got = {k: t for b in plain.fetch(manifests[v]) for k, t in b.tensors.items()}
        assert torch.equal(got["w"], states[v]["w"])
    assert plain._buffers == {}
    sender.close()
