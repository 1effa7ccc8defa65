"""The collective path of WeightStager (rollart_sdk.weights.direct): an engine whose own
"workers" receive, against the real ``local`` transport offering a receiver spec. The
nccl transport's test and the vLLM plugin's heavy suite run it over gloo."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rollart_sdk.testing.transport import DirectRecordingEngine, make_state_dict
from rollart_sdk.types import WeightManifest
from rollart_sdk.weights import LocalTransport, WeightStager, WeightSyncError, split_buckets
from rollart_sdk.weights.direct import manifest_from_json, manifest_to_json

pytestmark = pytest.mark.timeout(60)


class OfferingLocal(LocalTransport):
    """``local`` with a receiver spec: a receiver of the channel can be built elsewhere."""

    def receiver_spec(self) -> dict[str, Any]:
        return {"factory": "rollart_sdk.weights.local:LocalTransport",
                "kwargs": {"channel": self.channel}}


def publish(sender: LocalTransport, version: int) -> WeightManifest:
    state = make_state_dict(version)
    return sender.publish(version, split_buckets(state.items(), 4096, version))


def test_an_engine_receiver_takes_the_collective_path(tmp_path):
    async def run() -> tuple[WeightStager, DirectRecordingEngine, Any]:
        sender = LocalTransport("sender", channel="direct-a")
        engine = DirectRecordingEngine()
        stager = WeightStager(OfferingLocal("receiver", channel="direct-a"), engine=engine)
        stager.start(publish(sender, 1))
        assert stager.direct
        report = await stager.commit(engine, timeout_s=30)
        engine.close()
        return stager, engine, report

    stager, engine, report = asyncio.run(run())
    assert engine.version == 1 and engine.staged == [1] and report.version == 1
    assert report.direct
    assert sorted(engine.tensors) == sorted(make_state_dict(1))
    assert report.nbytes == sum(t.nbytes for t in make_state_dict(1).values())


def test_a_transport_without_a_spec_keeps_the_bytes_path():
    async def run() -> DirectRecordingEngine:
        sender = LocalTransport("sender", channel="direct-b")
        engine = DirectRecordingEngine()
        stager = WeightStager(LocalTransport("receiver", channel="direct-b"), engine=engine)
        stager.start(publish(sender, 1))
        assert not stager.direct
        await stager.commit(engine, timeout_s=30)
        return engine

    engine = asyncio.run(run())
    assert engine.version == 1 and engine.staged == []


def test_newer_version_supersedes_and_a_failure_leaves_the_engine_alone():
    async def run() -> tuple[DirectRecordingEngine, str, dict[str, Any]]:
        sender = LocalTransport("sender", channel="direct-c")
        engine = DirectRecordingEngine()
        stager = WeightStager(OfferingLocal("receiver", channel="direct-c"), engine=engine)
        stager.start(publish(sender, 1))
        stager.start(publish(sender, 2))  # before the commit: the workers stage 2
        await stager.commit(engine, timeout_s=30)
        missing = WeightManifest(7, "local", [], {"channel": "direct-c"})
        stager.start(missing)  # never published: the worker's fetch fails
        with pytest.raises(WeightSyncError) as err:
            await stager.commit(engine, timeout_s=30)
        publish(sender, 3)
        stager.start(publish(sender, 4))
        stager.cancel()  # the workers drop it too
        await asyncio.sleep(0.05)
        status = engine.worker.status()
        engine.close()
        return engine, str(err.value), status

    engine, error, status = asyncio.run(run())
    assert engine.version == 2 and engine.loads == [2] and engine.staged == [1, 2, 7, 4]
    assert "engine's worker failed to receive it" in error and "not" in error
    assert status["version"] is None


def test_collective_path_needs_a_running_loop():
    stager = WeightStager(OfferingLocal("receiver", channel="direct-d"),
                          engine=DirectRecordingEngine())
    sender = LocalTransport("sender", channel="direct-d")
    with pytest.raises(RuntimeError, match="running event loop"):
        stager.start(publish(sender, 1))


def test_manifest_round_trips_through_json():
    sender = LocalTransport("sender", channel="direct-e")
    manifest = publish(sender, 3)
    back = manifest_from_json(manifest_to_json(manifest))
    assert back.version == 3 and back.meta == manifest.meta
    assert [(b.index, b.names, b.checksum) for b in back.buckets] == \
        [(b.index, b.names, b.checksum) for b in manifest.buckets]
