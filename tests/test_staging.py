"""WeightStager: background receive overlapping generation, all-or-nothing swap.

Real torch tensors over the real "ray" transport; the engine is a small recording class
(it stores what load_weights got), so no inference engine is needed here.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Iterator

import pytest
import torch

ray = pytest.importorskip("ray")
transport_mod = pytest.importorskip("rollart_transport_ray.transport")

from rollart_sdk.ray_utils import init_ray  # noqa: E402
from rollart_sdk.testing.transport import RecordingEngine, make_state_dict  # noqa: E402
from rollart_sdk.types import WeightBucket, WeightManifest  # noqa: E402
from rollart_sdk.weights import WeightLoader, WeightStager, WeightSyncError, checksum, split_buckets  # noqa: E402

RayObjectStoreTransport = transport_mod.RayObjectStoreTransport
BUCKET_BYTES = 2048
DELAY_S = 0.08  # injected latency per bucket


@pytest.fixture(scope="module", autouse=True)
def ray_session():
    torch.set_num_threads(1)
    init_ray(num_cpus=1)
    yield
    ray.shutdown()


class SlowRayTransport(RayObjectStoreTransport):
    """The real Ray transport with a slow link: every bucket takes ``delay_s`` longer."""

    def __init__(self, role: str, delay_s: float = DELAY_S, **kw) -> None:
        super().__init__(role, **kw)
        self.delay_s = delay_s

    def fetch(self, manifest: WeightManifest) -> Iterator[WeightBucket]:
        for bucket in super().fetch(manifest):
            time.sleep(self.delay_s)
            yield bucket


class FailingMidwayTransport(RayObjectStoreTransport):
    """Delivers some buckets, then the link breaks (an arbitrary, non-rollart error)."""

    def fetch(self, manifest: WeightManifest) -> Iterator[WeightBucket]:
        for i, bucket in enumerate(super().fetch(manifest)):
            if i == 2:
                raise ConnectionError("link to the object store dropped")
            yield bucket


class LossyTransport(RayObjectStoreTransport):
    """A buggy transport that silently drops its last bucket."""

    def fetch(self, manifest: WeightManifest) -> Iterator[WeightBucket]:
        buckets = list(super().fetch(manifest))
        yield from buckets[:-1]


class BrokenEngine(RecordingEngine):
    async def load_weights(self, buckets: Iterable[WeightBucket], version: int) -> int:
        raise RuntimeError("out of GPU memory while swapping")


def bucketed(version: int) -> list[WeightBucket]:
    return list(split_buckets(make_state_dict(version).items(), BUCKET_BYTES, version))


def fingerprint(tensors: dict) -> dict[str, str]:
    return {k: checksum({k: v}) for k, v in tensors.items()}


@pytest.fixture
def sender():
    s = RayObjectStoreTransport("sender", keep_versions=4)
    yield s
    s.close()


async def committed_engine(sender, version: int = 1) -> RecordingEngine:
    """An engine that already runs ``version`` (delivered through a stager)."""
    engine = RecordingEngine()
    stager = WeightStager(RayObjectStoreTransport("receiver"))
    stager.start(sender.publish(version, bucketed(version)))
    await stager.commit(engine, timeout_s=60)
    assert engine.version == version
    return engine


def test_recording_engine_loads_what_it_is_given():
    """The test engine every stager test commits into: a load replaces its whole state
    with copies of the buckets' tensors, at the given version."""
    engine = RecordingEngine(version=0, tensors={"stale": torch.ones(1)})
    assert isinstance(engine, WeightLoader)
    buckets = list(bucketed(1))
    assert asyncio.run(engine.load_weights(buckets, 1)) == 0
    assert engine.version == 1 and engine.loads == [1]
    want = make_state_dict(1)
    assert sorted(engine.tensors) == sorted(want)  # "stale" is gone: a whole swap
    for name, t in want.items():
        assert torch.equal(engine.tensors[name], t)
    name, sent = next((k, v) for b in buckets for k, v in b.tensors.items() if v.numel())
    assert engine.tensors[name] is not sent  # a copy: the bucket may be reused or freed


def test_receive_overlaps_generation_and_exposes_only_the_swap(sender):
    manifest = sender.publish(1, bucketed(1))
    n = len(manifest.buckets)
    assert n >= 6

    async def run() -> tuple:
        # Overlapped: start, keep "generating" (the loop must stay free), commit after.
        engine = RecordingEngine()
        stager = WeightStager(SlowRayTransport("receiver"))
        ticks = 0
        t0 = time.perf_counter()
        stager.start(manifest)
        start_s = time.perf_counter() - t0
        deadline = time.monotonic() + 60
        while not stager.ready and time.monotonic() < deadline:
            ticks += 1  # a decode step would run here
            await asyncio.sleep(0.005)
        overlapped = await stager.commit(engine, timeout_s=60)

        # Not overlapped: commit right after start pays for the whole transfer.
        engine2 = RecordingEngine()
        stager2 = WeightStager(SlowRayTransport("receiver"))
        stager2.start(manifest)
        blocking = await stager2.commit(engine2, timeout_s=60)
        return overlapped, blocking, ticks, start_s, engine, engine2

    overlapped, blocking, ticks, start_s, engine, engine2 = asyncio.run(run())
    expected = fingerprint(make_state_dict(1))
    assert fingerprint(engine.tensors) == expected and fingerprint(engine2.tensors) == expected
    assert engine.version == engine2.version == 1
    # The injected latency is a floor on the transfer time, not a speed assumption.
    assert overlapped.transfer_s >= n * DELAY_S
    assert start_s < overlapped.transfer_s  # start() did not wait for the transfer
    assert ticks > 1  # the event loop kept running while buckets arrived
    assert overlapped.exposed_s < overlapped.transfer_s
    assert overlapped.exposed_s < blocking.exposed_s  # overlap is what hid it
    assert blocking.exposed_s >= n * DELAY_S * 0.5
    assert overlapped.nbytes == blocking.nbytes == manifest.nbytes
    assert overlapped.version == 1 and overlapped.recomputed_requests == 0


def test_newer_start_supersedes_an_unfinished_one(sender):
    m1 = sender.publish(1, bucketed(1))
    m2 = sender.publish(2, bucketed(2))

    async def run() -> tuple:
        engine = RecordingEngine()
        stager = WeightStager(SlowRayTransport("receiver"))
        stager.start(m1)
        assert stager.staged_version == 1 and not stager.ready
        stager.start(m2)
        assert stager.staged_version == 2
        return await stager.commit(engine, timeout_s=60), engine

    report, engine = asyncio.run(run())
    assert report.version == 2 and engine.version == 2
    assert engine.loads == [2]  # version 1 was never loaded
    assert fingerprint(engine.tensors) == fingerprint(make_state_dict(2))


def test_corrupt_transfer_leaves_engine_on_its_old_version(sender):
    async def run() -> tuple:
        engine = await committed_engine(sender, 1)
        bad = bucketed(2)
        victim = next(t for t in bad[3].tensors.values() if t.numel() > 0)
        victim.view(-1)[0] += 1  # bytes change after the checksum was taken
        stager = WeightStager(RayObjectStoreTransport("receiver"))
        stager.start(sender.publish(2, bad))
        with pytest.raises(WeightSyncError) as info:
            await stager.commit(engine, timeout_s=60)
        return engine, info.value, stager

    engine, err, stager = asyncio.run(run())
    assert err.version == 2 and err.bucket == 3 and "corrupt" in str(err)
    assert engine.version == 1 and engine.loads == [1]
    assert fingerprint(engine.tensors) == fingerprint(make_state_dict(1))
    assert stager.staged_version is None  # a failed transfer is not kept around


@pytest.mark.parametrize(
    "transport_cls, reason",
    [(FailingMidwayTransport, "ConnectionError: link to the object store dropped"),
     (LossyTransport, "1 of")],
    ids=["fails-midway", "drops-a-bucket"],
)
def test_partial_transfer_never_reaches_the_engine(sender, transport_cls, reason):
    async def run() -> tuple:
        engine = await committed_engine(sender, 1)
        stager = WeightStager(transport_cls("receiver"))
        stager.start(sender.publish(2, bucketed(2)))
        with pytest.raises(WeightSyncError) as info:
            await stager.commit(engine, timeout_s=60)
        return engine, info.value

    engine, err = asyncio.run(run())
    assert err.version == 2 and reason in str(err)
    assert engine.version == 1 and engine.loads == [1]
    assert fingerprint(engine.tensors) == fingerprint(make_state_dict(1))


def test_commit_timeout_keeps_the_transfer_staged(sender):
    manifest = sender.publish(1, bucketed(1))

    async def run() -> tuple:
        engine = RecordingEngine()
        stager = WeightStager(SlowRayTransport("receiver", delay_s=0.2))
        stager.start(manifest)
        with pytest.raises(WeightSyncError, match="did not finish within") as info:
            await stager.commit(engine, timeout_s=0.01)
        untouched = (engine.version, list(engine.loads))
        report = await stager.commit(engine, timeout_s=60)  # the transfer carried on
        return info.value, untouched, report, engine

    err, untouched, report, engine = asyncio.run(run())
    assert err.version == 1 and untouched == (0, [])
    assert report.version == 1 and engine.version == 1


def test_commit_errors_name_the_problem(sender):
    async def run() -> list[str]:
        messages = []
        with pytest.raises(WeightSyncError, match="nothing is staged"):
            await WeightStager(RayObjectStoreTransport("receiver")).commit(RecordingEngine())
        stager = WeightStager(RayObjectStoreTransport("receiver"))
        stager.start(sender.publish(2, bucketed(2)))
        ahead = RecordingEngine(version=3)
        with pytest.raises(WeightSyncError, match="older than the engine's version 3") as e1:
            await stager.commit(ahead, timeout_s=60)
        messages.append(str(e1.value))
        assert ahead.version == 3 and ahead.loads == []
        stager.start(sender.publish(4, bucketed(4)))
        with pytest.raises(WeightSyncError, match="load_weights raised RuntimeError") as e2:
            await stager.commit(BrokenEngine(), timeout_s=60)
        messages.append(str(e2.value))
        return messages

    messages = asyncio.run(run())
    assert "version 2" in messages[0] and "version 4" in messages[1]
