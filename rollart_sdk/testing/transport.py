"""``check_transport``: the conformance kit every weight-transport plugin runs in its tests.

Like gymnasium's ``check_env``: call it with factories of your sender and receivers and
it raises ``AssertionError`` naming the broken promise. It checks, through the same
:class:`rollart_sdk.weights.WeightStager` an engine worker uses:

1. buckets arrive whole: every tensor name, exact dtype, shape and bytes, several buckets;
2. versioned: two versions in sequence each land as that version, on every receiver;
3. checksummed: a bucket whose bytes no longer match its checksum is rejected and the
   receiving engine stays on its old version with its old weights (never a torn mix);
4. pull style only: a released version can no longer be fetched;
5. pull style only: the version the engines serve stays fetchable while one newer version
   is received and another is published (deferred weight updates): an engine restarted
   then reloads it (``EngineRecovery``, docs/failures.md). So a sender keeps at least the
   3 newest versions by default.

Pull transports (``style = "pull"``) are driven as publish, then every receiver fetches
the returned manifest. Push transports (``style = "push"``) are driven as the protocol
says: ``publish`` runs in a thread while every receiver fetches concurrently, by a
manifest planned beforehand (``make_manifest``, default
:func:`rollart_sdk.weights.plan_manifest` with ``name``).

Example (a plugin's test)::

    def test_conformance(ray_session):
        check_transport(lambda: MyTransport(role="sender"),
                        lambda: MyTransport(role="receiver"))
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterable
from typing import Any

from rollart_sdk.interfaces import WeightTransport
from rollart_sdk.types import WeightBucket, WeightManifest, WeightUpdateReport
from rollart_sdk.weights import (
    CorruptBucketError,
    WeightStager,
    WeightSyncError,
    checksum,
    plan_manifest,
    split_buckets,
)

__all__ = ["DirectRecordingEngine", "LoadingThrough", "RecordingEngine", "check_transport", "make_state_dict"]


class RecordingEngine:
    """The smallest engine a stager can load into: it keeps a copy of every tensor.

    Implements the weight half of :class:`rollart_sdk.interfaces.InferenceEngine`
    (``version`` and ``load_weights``), which is all a :class:`WeightStager` touches.
    A load replaces the whole state at once, like a real engine's swap.
    """

    def __init__(self, version: int = 0, tensors: dict[str, Any] | None = None) -> None:
        self._version = version
        self.tensors: dict[str, Any] = dict(tensors or {})
        self.loads: list[int] = []

    @property
    def version(self) -> int:
        return self._version

    async def load_weights(self, buckets: Iterable[WeightBucket], version: int) -> int:
        state: dict[str, Any] = {}
        for bucket in buckets:
            for name, tensor in bucket.tensors.items():
                state[name] = tensor.clone()
        self.tensors = state
        self._version = version
        self.loads.append(version)
        return 0


class DirectRecordingEngine(RecordingEngine):
    """A :class:`RecordingEngine` on the collective path: its "worker" (a
    :class:`~rollart_sdk.weights.direct.WorkerStaging`, here in this process) builds its
    own receiver from the transport's ``receiver_spec`` and receives every version, as
    vLLM's and SGLang's workers do. ``check_transport(..., make_engine=DirectRecordingEngine)``
    checks a transport's collective path."""

    def __init__(self, version: int = 0, tensors: dict[str, Any] | None = None) -> None:
        from rollart_sdk.weights.direct import WorkerStaging

        super().__init__(version, tensors)
        self.worker = WorkerStaging()
        self.staged: list[int] = []

    def receives_directly(self, manifest: WeightManifest) -> bool:
        return True

    async def stage_direct(self, manifest: WeightManifest, spec: dict[str, Any]) -> None:
        from rollart_sdk.weights.direct import manifest_to_json

        self.worker.stage(manifest_to_json(manifest), spec)
        self.staged.append(manifest.version)

    async def direct_status(self) -> dict[str, Any]:
        return self.worker.status()

    async def commit_direct(self, version: int) -> int:
        return await self.load_weights(self.worker.take(version), version)

    async def cancel_direct(self, version: int) -> None:
        self.worker.cancel(version)

    def close(self) -> None:
        self.worker.close()


class LoadingThrough:
    """An engine whose ``load_weights`` goes the engine worker's way: published by
    ``sender``, staged by a :class:`WeightStager` on ``receiver`` (``engine=`` the engine,
    so a transport and engine that both offer it take the collective path,
    ``rollart_sdk.weights.direct``), committed. Everything else is the engine's own.

    The engine conformance kit's ``update`` check run on it exercises that path::

        check_engine(lambda: LoadingThrough(make(), sender, receiver, "nccl"), ...)

    ``reports`` keeps every update's :class:`WeightUpdateReport`; ``direct`` whether each
    took the collective path.
    """

    def __init__(self, engine: Any, sender: WeightTransport, receiver: WeightTransport,
                 name: str, timeout_s: float = 120.0) -> None:
        self.engine = engine
        self.sender = sender
        self.receiver = receiver
        self.transport_name = name
        self.timeout_s = timeout_s
        self.reports: list[WeightUpdateReport] = []
        self.direct: list[bool] = []

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.engine, attr)

    @property
    def version(self) -> int:
        return int(self.engine.version)

    async def load_weights(self, buckets: Iterable[WeightBucket], version: int) -> int:
        buckets = list(buckets)
        stager = WeightStager(self.receiver, name="loading-through", engine=self.engine)
        style = getattr(type(self.sender), "style", "pull")
        thread: threading.Thread | None = None
        published: dict[str, Any] = {}
        if style == "push":
            stager.start(plan_manifest(version, self.transport_name, buckets))
            thread = _publish_in_thread(self.sender, version, buckets, published)
        else:
            stager.start(self.sender.publish(version, buckets))
        self.direct.append(stager.direct)
        try:
            report = await stager.commit(self.engine, timeout_s=self.timeout_s)
        finally:
            stager.close()
            if thread is not None:
                await asyncio.to_thread(thread.join, self.timeout_s)
        if "error" in published:
            raise AssertionError(f"publish(version={version}) raised") from published["error"]
        self.reports.append(report)
        return report.recomputed_requests

    async def shutdown(self) -> None:
        await self.engine.shutdown()
        for transport in (self.receiver, self.sender):
            transport.close()


def make_state_dict(version: int, seed: int = 0) -> dict[str, Any]:
    """A small state dict with awkward members: several dtypes, a 0-d and an empty tensor.

    Values depend on ``version`` so that two versions never share bytes.
    """
    import torch

    g = torch.Generator().manual_seed(seed * 1000 + version)
    return {
        "embed.weight": torch.randn(64, 32, generator=g),
        "layers.0.attn.q.weight": torch.randn(32, 32, generator=g).to(torch.bfloat16),
        "layers.0.attn.q.bias": torch.randn(32, generator=g).to(torch.float16),
        "layers.0.mlp.weight": torch.randn(48, 32, generator=g),
        "layers.0.norm.scale": torch.tensor(float(version) + 0.5),
        "position.ids": torch.arange(16, dtype=torch.int64) + version,
        "empty.buffer": torch.zeros(0, 4),
        "lm_head.weight": torch.randn(64, 32, generator=g),
    }


def check_transport(
    make_sender: Callable[[], WeightTransport],
    make_receiver: Callable[[], WeightTransport],
    *,
    num_receivers: int = 2,
    name: str | None = None,
    make_manifest: Callable[[int, list[WeightBucket]], WeightManifest] | None = None,
    bucket_bytes: int = 4096,
    timeout_s: float = 60.0,
    make_engine: Callable[[], RecordingEngine] | None = None,
) -> dict[str, Any]:
    """Run the conformance checks; returns a summary dict, raises AssertionError on failure.

    ``make_engine()`` builds each receiver's engine (default :class:`RecordingEngine`); an
    engine that is also an ``EngineReceiver`` makes each version take the collective path
    (``rollart_sdk.weights.direct``: its own workers receive).

    ``make_sender()`` is called once, ``make_receiver()`` ``num_receivers`` times; both may
    return objects already wired together (a process group, a store address). ``name``
    is the transport's registered name (needed for push style, to plan manifests).
    Every wait is bounded by ``timeout_s``.
    """
    return asyncio.run(
        _check(make_sender, make_receiver, num_receivers, name, make_manifest,
               bucket_bytes, timeout_s, make_engine or RecordingEngine)
    )


async def _check(
    make_sender: Callable[[], WeightTransport],
    make_receiver: Callable[[], WeightTransport],
    num_receivers: int,
    name: str | None,
    make_manifest: Callable[[int, list[WeightBucket]], WeightManifest] | None,
    bucket_bytes: int,
    timeout_s: float,
    make_engine: Callable[[], RecordingEngine],
) -> dict[str, Any]:
    sender = make_sender()
    receivers = [make_receiver() for _ in range(num_receivers)]
    style, make_manifest = _style_and_manifest(sender, receivers, name, make_manifest)
    engines = [make_engine() for _ in receivers]
    stagers = [WeightStager(r, name=f"check-receiver-{i}", engine=e)
               for i, (r, e) in enumerate(zip(receivers, engines, strict=True))]
    summary: dict[str, Any] = {"style": style, "receivers": num_receivers, "versions": []}
    manifests: dict[int, WeightManifest] = {}
    try:
        # 1 + 2: two good versions in sequence, whole and versioned on every receiver.
        for version in (1, 2):
            state = make_state_dict(version)
            buckets = list(split_buckets(state.items(), bucket_bytes, version))
            assert len(buckets) >= 3, "check_transport: bucket_bytes too large for the kit"
            manifest, reports = await _deliver(
                sender, stagers, engines, version, buckets, style, make_manifest, timeout_s
            )
            manifests[version] = manifest
            _assert_manifest(manifest, version, state, buckets)
            for i, (engine, report) in enumerate(zip(engines, reports, strict=True)):
                assert engine.version == version, (
                    f"receiver {i}: engine at version {engine.version} after delivering "
                    f"version {version}"
                )
                _assert_same_state(engine.tensors, state, f"receiver {i}, version {version}")
                assert report.nbytes == manifest.nbytes, (
                    f"receiver {i}: received {report.nbytes} bytes, manifest says "
                    f"{manifest.nbytes}"
                )
            summary["versions"].append(version)
            summary["buckets"] = len(buckets)
            summary["nbytes"] = manifest.nbytes

        good = make_state_dict(2)

        # 3: a corrupt bucket is rejected; engines stay on version 2 with version 2 bytes.
        state = make_state_dict(3)
        buckets = list(split_buckets(state.items(), bucket_bytes, 3))
        victim = buckets[len(buckets) // 2]
        tensor = next(t for t in victim.tensors.values() if t.numel() > 0)
        tensor.view(-1)[0] += 1  # bytes change after the checksum was taken
        rejected = await _expect_failure(
            sender, stagers, engines, 3, buckets, style, make_manifest, timeout_s
        )
        for i, engine in enumerate(engines):
            assert engine.version == 2, (
                f"receiver {i}: a corrupt bucket of version 3 was loaded (engine at version "
                f"{engine.version}); fetch must verify every bucket against the manifest "
                "checksum (rollart_sdk.weights.verify(bucket, ref, version)) and raise"
            )
            _assert_same_state(engine.tensors, good, f"receiver {i} after a corrupt transfer")
        summary["corrupt_rejected"] = rejected

        # 4: pull only: a released version cannot be fetched any more.
        if style == "pull":
            summary["released_error"] = await _check_released(
                sender, receivers[0], manifests[1], timeout_s
            )
            # 5: the served version survives two newer publishes.
            summary["served_kept"] = await _check_served_kept(
                sender, receivers[0], bucket_bytes, timeout_s
            )
    finally:
        for stager in stagers:
            stager.close()
        for transport in (sender, *receivers):
            transport.close()
        for engine in engines:
            close = getattr(engine, "close", None)
            if callable(close):
                close()
    return summary


def _style_and_manifest(
    sender: WeightTransport,
    receivers: list[WeightTransport],
    name: str | None,
    make_manifest: Callable[[int, list[WeightBucket]], WeightManifest] | None,
) -> tuple[str, Callable[[int, list[WeightBucket]], WeightManifest] | None]:
    """The transports' common style; for push, how to plan a manifest up front."""
    style = getattr(type(sender), "style", getattr(sender, "style", None))
    assert style in ("push", "pull"), (
        f"{type(sender).__name__}.style must be 'push' or 'pull', got {style!r}"
    )
    for r in receivers:
        assert getattr(r, "style", None) == style, (
            f"sender style {style!r} but receiver {type(r).__name__} has style "
            f"{getattr(r, 'style', None)!r}"
        )
    if style == "push" and make_manifest is None:
        if not name:
            raise ValueError(
                "check_transport: a push transport needs name='<registered name>' (or "
                "make_manifest=...) so that receivers can be given the manifest up front"
            )
        transport_name = name

        def make_manifest(version: int, buckets: list[WeightBucket]) -> WeightManifest:
            return plan_manifest(version, transport_name, buckets)

    return style, make_manifest


async def _check_released(sender: WeightTransport, receiver: WeightTransport,
                          manifest: WeightManifest, timeout_s: float) -> str:
    """After ``sender.release(1)`` a fetch of version 1 fails; returns the error text."""
    sender.release(1)
    fresh = RecordingEngine(version=0)
    stager = WeightStager(receiver, name="check-released")
    stager.start(manifest)
    try:
        await stager.commit(fresh, timeout_s=timeout_s)
    except WeightSyncError as exc:
        assert fresh.version == 0 and not fresh.loads, "a released version was loaded"
        return str(exc)
    finally:
        stager.close()
    raise AssertionError(
        "fetch of a released version (1) succeeded; release(version) must make it unfetchable"
    )


async def _check_served_kept(sender: WeightTransport, receiver: WeightTransport,
                             bucket_bytes: int, timeout_s: float) -> int:
    """Publishes versions 4, 5 and 6 (served, being received, just published), then a
    fresh engine (a restarted one) fetches version 4: whole, as version 4. Returns 4."""
    manifests = {}
    for version in (4, 5, 6):
        state = make_state_dict(version)
        manifests[version] = sender.publish(
            version, list(split_buckets(state.items(), bucket_bytes, version)))
    fresh = RecordingEngine(version=0)
    stager = WeightStager(receiver, name="check-served-kept")
    stager.start(manifests[4])
    try:
        await stager.commit(fresh, timeout_s=timeout_s)
    except WeightSyncError as exc:
        raise AssertionError(
            "a restarted engine could not reload the served version 4 after versions 5 "
            f"(being received) and 6 were published ({exc}); with deferred weight updates "
            "a sender must keep the 3 newest versions fetchable by default (keep_versions=3, "
            "docs/failures.md)"
        ) from exc
    finally:
        stager.close()
    assert fresh.version == 4, f"a restarted engine reloaded version {fresh.version}, not 4"
    _assert_same_state(fresh.tensors, make_state_dict(4), "a restarted engine reloading 4")
    return 4


async def _deliver(
    sender: WeightTransport,
    stagers: list[WeightStager],
    engines: list[RecordingEngine],
    version: int,
    buckets: list[WeightBucket],
    style: str,
    make_manifest: Callable[[int, list[WeightBucket]], WeightManifest] | None,
    timeout_s: float,
) -> tuple[WeightManifest, list[WeightUpdateReport]]:
    """Publish ``buckets`` and commit them on every engine (push: all concurrently)."""
    if style == "pull":
        manifest = sender.publish(version, buckets)
        for stager in stagers:
            stager.start(manifest)
        reports = await asyncio.gather(
            *(s.commit(e, timeout_s=timeout_s) for s, e in zip(stagers, engines, strict=True))
        )
        return manifest, list(reports)
    assert make_manifest is not None
    planned = make_manifest(version, buckets)
    published: dict[str, Any] = {}
    thread = _publish_in_thread(sender, version, buckets, published)
    for stager in stagers:
        stager.start(planned)
    try:
        reports = await asyncio.gather(
            *(s.commit(e, timeout_s=timeout_s) for s, e in zip(stagers, engines, strict=True))
        )
    finally:
        await asyncio.to_thread(thread.join, timeout_s)
    assert not thread.is_alive(), f"publish(version={version}) did not return in {timeout_s}s"
    if "error" in published:
        raise AssertionError(f"publish(version={version}) raised") from published["error"]
    return published.get("manifest", planned), list(reports)


async def _expect_failure(
    sender: WeightTransport,
    stagers: list[WeightStager],
    engines: list[RecordingEngine],
    version: int,
    buckets: list[WeightBucket],
    style: str,
    make_manifest: Callable[[int, list[WeightBucket]], WeightManifest] | None,
    timeout_s: float,
) -> str:
    """Deliver a broken version; return where it was rejected ("publish" or "fetch")."""
    if style == "pull":
        try:
            manifest = sender.publish(version, buckets)
        except Exception as exc:
            # Refusing to publish corrupt bytes is fine too, for that reason only.
            if _corruption(exc) is None:
                raise AssertionError(
                    f"publish(version={version}) of a corrupt bucket raised "
                    f"{type(exc).__name__}: {exc}, not CorruptBucketError: verify with "
                    "rollart_sdk.weights.verify(bucket) and let its error through"
                ) from exc
            return "publish"
        for stager in stagers:
            stager.start(manifest)
    else:
        assert make_manifest is not None
        planned = make_manifest(version, buckets)
        # The plan carries the checksums the trainer computed, as a real one would.
        by_index = {b.index: b for b in buckets}
        for ref in planned.buckets:
            ref.checksum = by_index[ref.index].checksum
        _publish_in_thread(sender, version, buckets, {})
        for stager in stagers:
            stager.start(planned)
    for i, (stager, engine) in enumerate(zip(stagers, engines, strict=True)):
        try:
            await stager.commit(engine, timeout_s=timeout_s)
        except WeightSyncError as exc:
            # Rejected because the bucket is corrupt: not a time-out or another failure
            # that would have happened to a sound transfer too.
            if _corruption(exc) is None:
                raise AssertionError(
                    f"receiver {i}: the transfer of version {version} with a corrupt bucket "
                    f"failed, but not on the checksum: {exc}. fetch must verify every bucket "
                    "(rollart_sdk.weights.verify(bucket, ref, version)) and let its "
                    "CorruptBucketError through"
                ) from exc
            continue
        raise AssertionError(
            f"receiver {i}: a transfer with a corrupt bucket of version {version} committed "
            "without error; fetch must verify every bucket against the manifest checksum "
            "(rollart_sdk.weights.verify(bucket, ref, version)) and raise"
        )
    return "fetch"


def _corruption(exc: BaseException | None) -> CorruptBucketError | None:
    """The CorruptBucketError in ``exc``'s chain of causes, if any."""
    seen = 0
    while exc is not None and seen < 16:
        if isinstance(exc, CorruptBucketError):
            return exc
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def _publish_in_thread(
    sender: WeightTransport, version: int, buckets: list[WeightBucket], out: dict[str, Any]
) -> threading.Thread:
    def run() -> None:
        try:
            out["manifest"] = sender.publish(version, buckets)
        except Exception as exc:  # noqa: BLE001 - reported by the caller
            out["error"] = exc

    thread = threading.Thread(target=run, name=f"check-publish-v{version}", daemon=True)
    thread.start()
    return thread


def _assert_manifest(
    manifest: WeightManifest, version: int, state: dict[str, Any], buckets: list[WeightBucket]
) -> None:
    assert isinstance(manifest, WeightManifest), (
        f"publish must return a WeightManifest, got {type(manifest).__name__}"
    )
    assert manifest.version == version, f"manifest version {manifest.version} != {version}"
    names = [n for ref in manifest.buckets for n in ref.names]
    assert sorted(names) == sorted(state), (
        f"manifest lists tensors {sorted(names)}, the version has {sorted(state)}"
    )
    assert len(names) == len(set(names)), "manifest lists a tensor twice"
    by_index = {b.index: b for b in buckets}
    for ref in manifest.buckets:
        bucket = by_index.get(ref.index)
        assert bucket is not None, f"manifest lists bucket {ref.index} that was not published"
        assert ref.checksum == checksum(bucket.tensors), (
            f"manifest checksum of bucket {ref.index} does not match its tensors"
        )
        assert ref.nbytes == bucket.nbytes, f"manifest nbytes of bucket {ref.index} is wrong"


def _assert_same_state(got: dict[str, Any], want: dict[str, Any], where: str) -> None:
    assert sorted(got) == sorted(want), (
        f"{where}: engine holds tensors {sorted(got)}, expected {sorted(want)}"
    )
    for key, expected in want.items():
        actual = got[key]
        assert actual.dtype == expected.dtype and tuple(actual.shape) == tuple(expected.shape), (
            f"{where}: {key} arrived as {actual.dtype}{tuple(actual.shape)}, sent "
            f"{expected.dtype}{tuple(expected.shape)}"
        )
        assert checksum({key: actual}) == checksum({key: expected}), (
            f"{where}: {key} arrived with different bytes"
        )
