"""The collective path: an engine's own worker processes receive a push transport's round.

With a push transport (``nccl``: NCCL on GPUs, gloo on CPU) the engine worker's
:class:`~rollart_sdk.weights.WeightStager` would otherwise receive every bucket in the
engine worker's process and hand the tensors to ``engine.load_weights``; an engine whose
model lives in processes of its own (vLLM's workers, SGLang's scheduler) must then move
them once more (vLLM: serialised, through ``collective_rpc``). On the collective path the
engine's workers join the weight-update group themselves and receive the broadcast
straight into staging buffers beside the model (device memory with NCCL); the swap loads
from there. The protocol does not change: stage in the background, ``ready`` status,
suspend, commit all-or-nothing, resume.

Two sides meet here:

- a transport offers it with ``receiver_spec()``: how to build a receiver of the same
  round in another process (``{"factory": "module:Class", "kwargs": {...}}``, plain JSON),
  or None (a transport that stages to a store keeps the bytes path);
- an engine takes it by implementing :class:`EngineReceiver`; its worker processes hold a
  :class:`WorkerStaging` each (a ``WeightStager`` on that receiver, run there).

``WeightStager(transport, engine=engine)`` picks the collective path per version when both
sides offer it (:func:`direct_spec`), the bytes path otherwise.
"""

from __future__ import annotations

import json
from typing import Any, Protocol, runtime_checkable

from rollart_sdk.types import BucketRef, WeightBucket, WeightManifest
from rollart_sdk.weights.buckets import CorruptBucketError, WeightSyncError

__all__ = ["EngineReceiver", "WorkerStaging", "direct_spec", "manifest_from_json",
           "manifest_to_json", "remote_error"]


@runtime_checkable
class EngineReceiver(Protocol):
    """An engine whose own workers receive a version (the collective path).

    ``stage_direct`` returns at once (the workers receive in the background, generation
    goes on); ``direct_status`` is the workers' :meth:`WeightStager.status` combined
    (ready when every worker is; the first error); ``commit_direct`` swaps the staged
    version in, all or nothing (names and shapes checked before the model is touched),
    and returns the requests recomputed, like ``load_weights``.
    """

    def receives_directly(self, manifest: WeightManifest) -> bool: ...

    async def stage_direct(self, manifest: WeightManifest, spec: dict[str, Any]) -> None: ...

    async def direct_status(self) -> dict[str, Any]: ...

    async def commit_direct(self, version: int) -> int: ...

    async def cancel_direct(self, version: int) -> None: ...


def direct_spec(transport: Any, engine: Any, manifest: WeightManifest) -> dict[str, Any] | None:
    """The receiver spec when ``manifest`` takes the collective path, else None."""
    if engine is None or not isinstance(engine, EngineReceiver):
        return None
    offer = getattr(transport, "receiver_spec", None)
    spec = offer() if callable(offer) else None
    if spec is None or not engine.receives_directly(manifest):
        return None
    return dict(spec)


def manifest_to_json(manifest: WeightManifest) -> str:
    """A manifest as JSON (RPC layers such as vLLM's msgspec carry plain data only); a
    bucket handle must be JSON data (a push transport's are None)."""
    return json.dumps({
        "version": manifest.version, "transport": manifest.transport, "meta": manifest.meta,
        "buckets": [{"index": b.index, "names": b.names, "nbytes": b.nbytes,
                     "checksum": b.checksum, "handle": b.handle} for b in manifest.buckets],
    })


def manifest_from_json(text: str) -> WeightManifest:
    raw = json.loads(text)
    return WeightManifest(raw["version"], raw["transport"],
                          [BucketRef(**b) for b in raw["buckets"]], raw["meta"])


def remote_error(version: int, error: str) -> WeightSyncError:
    """A worker's failure text (``WeightStager.status()["error"]``) as an error here: a
    corrupt bucket stays a :class:`CorruptBucketError`."""
    if error.startswith("CorruptBucketError"):
        return CorruptBucketError(version, f"in the engine's worker: {error}")
    return WeightSyncError(version, f"the engine's worker failed to receive it: {error}")


class WorkerStaging:
    """Inside an engine's worker process: a :class:`WeightStager` on a receiver built
    from the transport's ``receiver_spec`` (kept across versions: an NCCL group is
    re-used while its members stay), holding a version until the swap takes it."""

    def __init__(self) -> None:
        self._spec: str | None = None
        self._receiver: Any = None
        self._stager: Any = None

    def stage(self, manifest_json: str, spec: dict[str, Any]) -> None:
        """Start receiving (a background thread); a newer version supersedes an older one."""
        from rollart_sdk.registry import import_string
        from rollart_sdk.weights.staging import WeightStager

        key = json.dumps(spec, sort_keys=True)
        if key != self._spec:
            self.close()
            factory = import_string(spec["factory"])
            self._receiver = factory(role="receiver", **spec.get("kwargs", {}))
            self._stager = WeightStager(self._receiver, name="engine-worker-stager")
            self._spec = key
        self._stager.start(manifest_from_json(manifest_json))

    def status(self) -> dict[str, Any]:
        if self._stager is None:
            return {"version": None, "ready": False, "error": None, "transfer_s": 0.0}
        status: dict[str, Any] = self._stager.status()
        return status

    def take(self, version: int) -> list[WeightBucket]:
        """The staged version's verified buckets (it must have arrived); staging is
        emptied. Raises :class:`WeightSyncError` when it is not ``version`` or failed."""
        staged = self.status()
        if staged["version"] != version or not staged["ready"]:
            raise WeightSyncError(version, f"this worker has not received it (staged: "
                                           f"{staged})")
        buckets: list[WeightBucket] = self._stager.take()
        return buckets

    def cancel(self, version: int | None = None) -> None:
        """Drop the staged version (only if it is ``version``, when given)."""
        if self._stager is not None and version in (None, self._stager.staged_version):
            self._stager.cancel()

    def close(self) -> None:
        if self._stager is not None:
            self._stager.close()
        if self._receiver is not None:
            self._receiver.close()
        self._spec = self._receiver = self._stager = None
