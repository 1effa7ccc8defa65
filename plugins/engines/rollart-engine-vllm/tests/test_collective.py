"""The collective path: vLLM's worker joins the ``nccl`` transport's group (gloo here) and
receives each version itself; the engine worker's process only passes the manifest.

- the transport conformance kit with vLLM's worker as the receiving process;
- a version delivered by a real ``NcclTransport`` sender lands in the model (the served
  parameters equal the sent ones, greedy output equals the new model's), nothing received
  in this process;
- a corrupt bucket and a bucket that does not fit the checkpoint are refused with the
  engine left on its old version and weights (all or nothing);
- ``direct=False`` keeps the bytes path.

The engine kit over this path is in test_conformance.py.
"""

from __future__ import annotations

import asyncio
import importlib.util
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
from rollart_sdk.types import WeightBucket, WeightManifest
from rollart_sdk.weights import (
    WeightStager,
    WeightSyncError,
    plan_manifest,
    split_buckets,
)

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                       reason="vLLM is not installed here; ci.sh runs these tests"),
    pytest.mark.skipif(importlib.util.find_spec("rollart_transport_nccl") is None,
                       reason="the nccl transport plugin is not installed"),
    pytest.mark.timeout(600),
]
EMBED = "model.embed_tokens.weight"


async def deliver(engine: Any, sender: Any, receiver: Any, buckets: list[WeightBucket],
                  version: int, manifest: WeightManifest | None = None) -> Any:
    """The engine worker's way: stage (collective path when offered), publish, commit."""
    stager = WeightStager(receiver, engine=engine)
    stager.start(manifest or plan_manifest(version, "nccl", buckets))
    direct = stager.direct
    thread = threading.Thread(target=sender.publish, args=(version, buckets), daemon=True)
    thread.start()
    try:
        return direct, await stager.commit(engine, timeout_s=120)
    finally:
        stager.close()
        await asyncio.to_thread(thread.join, 60)


def served(engine: Any, loop: asyncio.AbstractEventLoop, name: str) -> torch.Tensor:
    (values,) = loop.run_until_complete(engine._llm.collective_rpc("rollart_weight",
                                                                   args=(name,)))
    return torch.tensor(values)


def test_update_over_collective(module_engine, loop, other_weights, other_reference):
    engine = module_engine
    version = engine.version + 1
    buckets = list(split_buckets(other_weights.items(), bucket_bytes=30_000, version=version))
    sender, receiver = nccl_pair()
    try:
        direct, report = loop.run_until_complete(
            deliver(engine, sender, receiver, buckets, version))
    finally:
        receiver.close()
        sender.close()
    assert direct, "nccl + vllm must take the collective path"
    assert report.version == version == engine.version
    assert report.nbytes == sum(b.nbytes for b in buckets)
    # The engine worker's own receiver never joined a round: vLLM's worker did.
    assert receiver._gen == -1 and version in sender.sent_s and not sender.errors
    sent = other_weights[EMBED].float().flatten()  # vLLM pads the vocabulary rows
    torch.testing.assert_close(served(engine, loop, EMBED)[:sent.numel()], sent)
    # The whole model changed: the new checkpoint's log-probs of greedy tokens, 1e-4.
    from rollart_sdk.types import GenerationRequest, SamplingParams

    prompt = [9, 14, 20, 7, 33, 41, 12, 8]
    res = loop.run_until_complete(engine.generate(GenerationRequest(
        "greedy-after-collective", prompt, SamplingParams(temperature=0.0, max_new_tokens=8))))
    assert set(res.versions) == {version}
    ref = other_reference(prompt, res.token_ids)
    assert max(abs(a - b) for a, b in zip(res.logprobs, ref, strict=True)) < 1e-4


def test_corrupt_bucket_keeps_old_weights(module_engine, loop, other_weights):
    engine = module_engine
    old, before = engine.version, served(module_engine, loop, EMBED)
    version = old + 1
    state = {k: v * 0.5 for k, v in other_weights.items()}
    buckets = list(split_buckets(state.items(), bucket_bytes=30_000, version=version))
    manifest = plan_manifest(version, "nccl", buckets)  # checksums of the sound bytes
    buckets[len(buckets) // 2].tensors[next(iter(buckets[len(buckets) // 2].tensors))] \
        .view(-1)[0] += 1.0
    sender, receiver = nccl_pair()
    try:
        with pytest.raises(WeightSyncError) as err:
            loop.run_until_complete(deliver(engine, sender, receiver, buckets, version,
                                            manifest))
    finally:
        receiver.close()
        sender.close()
    assert "CorruptBucketError" in str(err.value) and "checksum" in str(err.value)
    assert engine.version == old
    torch.testing.assert_close(served(engine, loop, EMBED), before)


def test_bucket_that_does_not_fit_is_refused_before_the_swap(module_engine, loop,
                                                             other_weights):
    engine = module_engine
    old, before = engine.version, served(module_engine, loop, EMBED)
    version = old + 1
    state = dict(other_weights)
    state[EMBED] = state[EMBED][:-1].clone()  # one row short: fits no served parameter
    buckets = list(split_buckets(state.items(), bucket_bytes=30_000, version=version))
    sender, receiver = nccl_pair()
    try:
        with pytest.raises(WeightSyncError, match="shape"):
            loop.run_until_complete(deliver(engine, sender, receiver, buckets, version))
    finally:
        receiver.close()
        sender.close()
    assert engine.version == old and not engine.stats()["suspended"]
    torch.testing.assert_close(served(engine, loop, EMBED), before)


def test_direct_false_keeps_the_bytes_path(module_engine, loop, other_weights):
    engine = module_engine
    version = engine.version + 1
    buckets = list(split_buckets(other_weights.items(), bucket_bytes=30_000, version=version))
    sender, receiver = nccl_pair(direct=False)
    try:
        direct, report = loop.run_until_complete(
            deliver(engine, sender, receiver, buckets, version))
    finally:
        receiver.close()
        sender.close()
    assert not direct and receiver._gen >= 0  # this process joined the round
    assert engine.version == version == report.version
    check_adapters_take_the_bytes_path(engine, buckets, version)


class WorkerReceiver(EngineSideReceiver):
    """The kit's receiver whose ``fetch`` runs in vLLM's worker process: it stages the
    round there (the collective path) and reads back what that worker received."""

    def payloads(self, version: int) -> list[tuple[int, str | None, bytes]]:
        return self.call(self.engine._llm.collective_rpc("rollart_staged_payload",
                                                         args=(version,)))[0]


def test_transport_kit_with_vllm_worker_receiving(module_engine, loop):
    check_transport_in_engine(module_engine, loop, WorkerReceiver)
