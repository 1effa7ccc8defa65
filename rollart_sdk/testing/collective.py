"""Test helpers for an engine plugin's collective weight path (``stage_direct`` /
``direct_status`` / ``commit_direct``, docs/plugins.md): the engine's own worker process
joins the ``nccl`` transport's group (gloo on CPU) and receives each version itself.

The vLLM and SGLang plugins' ``tests/test_collective.py`` use them; a new engine plugin
with a collective path runs the same checks by giving :class:`EngineSideReceiver` the one
call that reads back what its worker staged:

- :func:`nccl_pair`: a sender and a receiver of the ``nccl`` transport (gloo, one
  receiver), the pair an engine worker and a trainer hold;
- :class:`EngineSideReceiver`: the transport kit's receiver whose ``fetch`` stages the
  round in the engine's own process (``stage_direct``), waits for it there and yields what
  that process received, so that :func:`rollart_sdk.testing.transport.check_transport`
  checks the collective path end to end;
- :func:`check_transport_in_engine`: that kit run against the engine (its event loop on a
  thread meanwhile);
- :func:`check_adapters_take_the_bytes_path`: a full checkpoint is offered the collective
  path, a manifest carrying adapter (LoRA) tensors is not.

They need the ``rollart-transport-nccl`` plugin installed and a real engine.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Coroutine, Iterable, Iterator
from typing import Any, ClassVar, Literal

from rollart_sdk.types import WeightBucket, WeightManifest
from rollart_sdk.weights import checksum, plan_manifest
from rollart_sdk.weights.direct import direct_spec, remote_error

CALL_TIMEOUT_S = 120.0


def nccl_pair(**receiver_options: Any) -> tuple[Any, Any]:
    """``(sender, receiver)`` of the ``nccl`` transport over gloo for one receiver;
    ``receiver_options`` go to the receiver (e.g. ``direct=False``)."""
    from rollart_transport_nccl.transport import NcclTransport

    sender = NcclTransport("sender", backend="gloo", receivers=1, timeout_s=60,
                           join_timeout_s=60)
    receiver = NcclTransport("receiver", store=sender.address, receivers=1, timeout_s=60,
                             join_timeout_s=60, **receiver_options)
    return sender, receiver


class EngineSideReceiver:
    """The transport kit's receiver whose ``fetch`` runs in the engine's own process.

    ``payloads(version)`` (the plugin's one call) returns what that process staged, as
    ``(index, checksum or None, safetensors bytes)`` per bucket; everything else (staging,
    waiting, the remote error) is the engine adapter's contract and the same for every
    engine."""

    style: ClassVar[Literal["push", "pull"]] = "push"

    def __init__(self, engine: Any, loop: asyncio.AbstractEventLoop, inner: Any) -> None:
        self.engine, self.loop, self.inner = engine, loop, inner

    def call(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coro`` on the engine's loop (running on another thread) and wait."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(CALL_TIMEOUT_S)

    def payloads(self, version: int) -> list[tuple[int, str | None, bytes]]:
        raise NotImplementedError("read back what the engine's process staged")

    def publish(self, version: int, buckets: Iterable[WeightBucket]) -> WeightManifest:
        raise NotImplementedError("a receiver: the kit's sender publishes")

    def fetch(self, manifest: WeightManifest) -> Iterator[WeightBucket]:
        from safetensors.torch import load

        v = manifest.version
        spec = direct_spec(self.inner, self.engine, manifest)
        assert spec is not None, "the engine refused the collective path for a checkpoint"
        self.call(self.engine.stage_direct(manifest, spec))
        while not (status := self.call(self.engine.direct_status()))["ready"]:
            threading.Event().wait(0.05)
        if status["error"]:
            raise remote_error(v, status["error"])
        for index, digest, payload in self.payloads(v):
            tensors = load(bytes(payload))
            yield WeightBucket(v, index, tensors, digest or checksum(tensors))

    def release(self, version: int) -> None: ...

    def close(self) -> None: ...


def check_transport_in_engine(engine: Any, loop: asyncio.AbstractEventLoop,
                              receiver_type: type[EngineSideReceiver]) -> dict[str, Any]:
    """The transport conformance kit with ``engine``'s process receiving (``loop`` runs
    on a thread meanwhile); returns the kit's summary after checking that versions 1 and
    2 landed, the corrupt bucket was refused by ``fetch`` and the sender sent 3 rounds."""
    from rollart_sdk.testing.transport import check_transport

    sender, inner = nccl_pair()
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    try:
        summary = check_transport(
            lambda: sender, lambda: receiver_type(engine, loop, inner),
            num_receivers=1, name="nccl", timeout_s=CALL_TIMEOUT_S)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        runner.join(30)
        inner.close()
        sender.close()
    assert summary["versions"] == [1, 2], summary
    assert summary["corrupt_rejected"] == "fetch", summary
    assert sorted(sender.sent_s) == [1, 2, 3], sender.sent_s
    return summary


def check_adapters_take_the_bytes_path(engine: Any, buckets: list[WeightBucket],
                                       version: int) -> None:
    """A checkpoint's manifest is offered the collective path; the same manifest with an
    adapter (LoRA) tensor in it is not (adapter payloads go by bytes)."""
    manifest = plan_manifest(version, "nccl", buckets)
    lora = WeightManifest(version, "nccl", [
        dataclasses.replace(manifest.buckets[0], names=["model.layers.0.mlp.down_proj.lora_A"]),
        *manifest.buckets[1:]])
    sender, with_direct = nccl_pair()
    try:
        assert direct_spec(with_direct, engine, manifest) is not None
        assert direct_spec(with_direct, engine, lora) is None
    finally:
        with_direct.close()
        sender.close()
