"""The collective path on the real SGLang 0.5.23 CPU engine: SGLang's scheduler process
joins the ``nccl`` transport's group (gloo here) and receives each version itself into a
staging buffer (``rollart_engine_sglang/scheduler.py``); the engine worker's process only
passes the manifest; the commit loads the checked version in one step.

- a version delivered by a real ``NcclTransport`` sender is received by the scheduler (not
  this process); the served weights are the old ones until the commit, the sent ones
  after, and greedy output's log-probs are the new checkpoint's (teacher-forced, 1e-4);
- a corrupt bucket and a bucket that does not fit the checkpoint are refused with the
  engine on its old version and weights, still serving them (greedy output = reference);
- ``direct=False`` keeps the bytes path;
- the transport conformance kit with SGLang's scheduler as the receiving process.

The engine kit over this path is in test_conformance.py. Real engine only (ci.sh part 2).
"""

from __future__ import annotations

import asyncio
import base64
import importlib.util
import sys
import threading
from typing import Any

import pytest
import torch

from rollart_sdk.testing.collective import (
    EngineSideReceiver,
    check_adapters_take_the_bytes_path,
    check_transport_in_engine,
    nccl_pair,
)
from rollart_sdk.types import GenerationRequest, SamplingParams, WeightBucket, WeightManifest
from rollart_sdk.weights import (
    WeightStager,
    WeightSyncError,
    plan_manifest,
    split_buckets,
)

pytestmark = [
    pytest.mark.skipif("rollart_sglang_contract" in sys.modules,
                       reason="needs the real SGLang (ROLLART_SGLANG_REAL=1, ci.sh part 2)"),
    pytest.mark.skipif(importlib.util.find_spec("rollart_transport_nccl") is None,
                       reason="the nccl transport plugin is not installed"),
    pytest.mark.timeout(900),
]
EMBED = "model.embed_tokens.weight"
PROMPT = [9, 14, 20, 7, 33, 41, 12, 8]


@pytest.fixture(scope="module")
def loop():
    lp = asyncio.new_event_loop()
    yield lp
    lp.close()


@pytest.fixture(scope="module")
def module_engine(tiny_model, loop):
    from rollart_engine_sglang.engine import SglangEngine

    engine = SglangEngine(model=tiny_model, device="cpu", context_length=1024,
                          max_total_tokens=16384)
    assert engine.direct_unavailable is None, engine.direct_unavailable
    yield engine
    loop.run_until_complete(asyncio.wait_for(engine.shutdown(), 120))


async def served(engine: Any) -> torch.Tensor:
    from sglang.srt.managers.io_struct import GetWeightsByNameReqInput

    rows = await engine._tm.get_weights_by_name(
        GetWeightsByNameReqInput(name=EMBED, truncate_size=1 << 20), None)
    return torch.tensor(rows)


async def deliver(engine: Any, sender: Any, receiver: Any, buckets: list[WeightBucket],
                  version: int, manifest: WeightManifest | None = None) -> Any:
    """The engine worker's way: stage (collective path when offered), publish, wait until
    it arrived, read the served weights (still the old ones), commit."""
    stager = WeightStager(receiver, engine=engine)
    stager.start(manifest or plan_manifest(version, "nccl", buckets))
    direct = stager.direct
    thread = threading.Thread(target=sender.publish, args=(version, buckets), daemon=True)
    thread.start()
    try:
        status = await stager.wait(120)
        before_commit = await served(engine)
        return direct, status, before_commit, await stager.commit(engine, timeout_s=120)
    finally:
        stager.close()
        await asyncio.to_thread(thread.join, 60)


async def greedy(engine: Any, rid: str) -> Any:
    return await engine.generate(GenerationRequest(
        rid, PROMPT, SamplingParams(temperature=0.0, max_new_tokens=8)))


def close_to(res: Any, reference: Any) -> float:
    ref = reference(PROMPT, res.token_ids)
    return max(abs(a - b) for a, b in zip(res.logprobs, ref, strict=True))


def test_update_over_collective(module_engine, loop, other_weights, other_reference):
    engine = module_engine
    old, version = engine.version, engine.version + 1
    before = loop.run_until_complete(served(engine))
    buckets = list(split_buckets(other_weights.items(), bucket_bytes=30_000, version=version))
    sender, receiver = nccl_pair()
    try:
        direct, status, before_commit, report = loop.run_until_complete(
            deliver(engine, sender, receiver, buckets, version))
    finally:
        receiver.close()
        sender.close()
    assert direct, "nccl + sglang must take the collective path"
    assert status["ready"] and status["error"] is None and status["version"] == version
    # Arrived in the scheduler's staging buffer, not yet served:
    torch.testing.assert_close(before_commit, before)
    assert report.direct and report.version == version == engine.version != old
    assert report.nbytes == sum(b.nbytes for b in buckets)
    # This process's receiver never joined a round: SGLang's scheduler did.
    assert receiver._gen == -1 and version in sender.sent_s and not sender.errors
    sent = other_weights[EMBED].float()
    torch.testing.assert_close(loop.run_until_complete(served(engine))[:sent.shape[0]], sent)
    res = loop.run_until_complete(greedy(engine, "greedy-after-collective"))
    assert set(res.versions) == {version}
    assert close_to(res, other_reference) < 1e-4


def serving(engine: Any, loop: asyncio.AbstractEventLoop, reference: Any,
            other_reference: Any, rid: str) -> Any:
    """Greedy output now, checked against the checkpoint the engine serves (version 0: the
    tiny model; every update in this module sends ``other_weights``)."""
    res = loop.run_until_complete(greedy(engine, rid))
    assert close_to(res, reference if engine.version == 0 else other_reference) < 1e-4
    return res


def refused(engine: Any, loop: asyncio.AbstractEventLoop, buckets: list[WeightBucket],
            version: int, manifest: WeightManifest | None = None) -> WeightSyncError:
    sender, receiver = nccl_pair()
    try:
        with pytest.raises(WeightSyncError) as err:
            loop.run_until_complete(deliver(engine, sender, receiver, buckets, version,
                                            manifest))
    finally:
        receiver.close()
        sender.close()
    assert receiver._gen == -1  # the scheduler received (and refused) it
    return err.value


def test_corrupt_bucket_keeps_old_weights(module_engine, loop, other_weights, reference,
                                          other_reference):
    engine = module_engine
    old, before = engine.version, loop.run_until_complete(served(engine))
    out_before = serving(engine, loop, reference, other_reference, "before-corrupt")
    version = old + 1
    state = {k: v * 0.5 for k, v in other_weights.items()}
    buckets = list(split_buckets(state.items(), bucket_bytes=30_000, version=version))
    manifest = plan_manifest(version, "nccl", buckets)  # checksums of the sound bytes
    bad = buckets[len(buckets) // 2]
    bad.tensors[next(iter(bad.tensors))].view(-1)[0] += 1.0
    err = refused(engine, loop, buckets, version, manifest)
    assert "CorruptBucketError" in str(err) and "checksum" in str(err)
    assert engine.version == old and not engine.stats()["suspended"]
    torch.testing.assert_close(loop.run_until_complete(served(engine)), before)
    out_after = serving(engine, loop, reference, other_reference, "after-corrupt")
    assert out_after.token_ids == out_before.token_ids and set(out_after.versions) == {old}


def test_bucket_that_does_not_fit_is_refused_before_the_swap(module_engine, loop,
                                                             other_weights, reference,
                                                             other_reference):
    engine = module_engine
    old, before = engine.version, loop.run_until_complete(served(engine))
    version = old + 1
    state = dict(other_weights)
    state[EMBED] = state[EMBED][:-1].clone()  # one row short: fits no served parameter
    buckets = list(split_buckets(state.items(), bucket_bytes=30_000, version=version))
    err = refused(engine, loop, buckets, version)
    assert "shape" in str(err) and "commit_direct" in str(err)
    assert engine.version == old and not engine.stats()["suspended"]
    torch.testing.assert_close(loop.run_until_complete(served(engine)), before)
    serving(engine, loop, reference, other_reference, "after-misfit")


def test_direct_false_keeps_the_bytes_path(module_engine, loop, other_weights):
    engine = module_engine
    version = engine.version + 1
    buckets = list(split_buckets(other_weights.items(), bucket_bytes=30_000, version=version))
    sender, receiver = nccl_pair(direct=False)
    try:
        direct, _, _, report = loop.run_until_complete(
            deliver(engine, sender, receiver, buckets, version))
    finally:
        receiver.close()
        sender.close()
    assert not direct and not report.direct and receiver._gen >= 0  # this process joined
    assert engine.version == version == report.version
    check_adapters_take_the_bytes_path(engine, buckets, version)


class SchedulerReceiver(EngineSideReceiver):
    """The kit's receiver whose ``fetch`` runs in SGLang's scheduler process: it stages the
    round there (the collective path) and reads back what the scheduler received."""

    def payloads(self, version: int) -> list[tuple[int, str | None, bytes]]:
        staged = self.call(self.engine._rpc.acall("rollart_payload", version=version))
        return [(index, digest, base64.b64decode(payload)) for index, digest, payload in staged]


def test_transport_kit_with_the_scheduler_receiving(module_engine, loop):
    check_transport_in_engine(module_engine, loop, SchedulerReceiver)
