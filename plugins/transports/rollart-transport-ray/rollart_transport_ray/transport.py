"""Weight transport through Ray's object store: publish once, every engine pulls.

The trainer-side transport (``role="sender"``) ``ray.put``s each bucket of a version once
and keeps the ObjectRefs; the manifest it returns carries those refs as
``BucketRef.handle``, so it can travel to any actor of the job (Ray serialises refs nested
in dataclasses and tracks the receivers as borrowers). Engine-side transports
(``role="receiver"``) ``ray.get`` each bucket and verify it against the manifest.

A bucket is stored as a :class:`PackedBucket`: each tensor's bytes as a numpy array with
its dtype and shape. Ray keeps numpy buffers out of band (one copy into the store, read
in place), where a torch tensor is pickled through ``torch.save`` on both sides: copies
and pickling that took about half of the trainer's CPU while it published SmolLM2's 540 MB
each step (docs/benchmarks.md, "The Ray transport without torch's pickling"). The
receiver copies each bucket once out of the read-only store buffer into one buffer of its
own, the bucket's tensors views of it. With ``reuse_receive_buffers`` (default) it keeps
that buffer and copies the next version's bucket into it once no tensor of the last one
is held any more (counted on the buffer's memory, so a view or a numpy array of a tensor
kept by the engine counts too; then a new buffer is taken): a large model's update then
writes into pages already mapped instead of faulting in fresh ones (SmolLM2's 651 MB: about
0.12 s a version instead of 0.3-1.8 s).

Releasing a version is the sender's decision, not a side effect of who still holds a
manifest: Ray frees an object only once every holder of its ref has dropped it, so a
stale manifest lying in some actor would otherwise keep an old version fetchable. The
sender therefore also records each live version in Ray's GCS key-value store; ``release``
deletes that key and drops the sender's refs, and ``fetch`` refuses a version whose key
is gone. The memory itself is reclaimed once the last manifest copy is dropped.
"""

from __future__ import annotations

import concurrent.futures
import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from rollart_sdk.types import WeightBucket, WeightManifest
from rollart_sdk.weights import WeightSyncError, bucket_ref, verify

if TYPE_CHECKING:  # the options are read when a config is resolved: no torch there
    import numpy as np

TRANSPORT_NAME = "ray"
_KV_NAMESPACE = "rollart"


class RayTransportOptions(BaseModel):
    """Options of ``transport: {name: ray, options: {...}}``."""

    model_config = ConfigDict(extra="forbid")

    keep_versions: int = Field(
        3,
        ge=1,
        description="published versions the sender keeps fetchable; publishing a newer "
        "one releases the oldest beyond this count (3: the version the engines serve, the "
        "one they receive and the one just published, with deferred updates; an engine "
        "restarted after its process died reloads the served one)",
    )
    fetch_timeout_s: float = Field(
        300.0,
        gt=0,
        description="seconds a receiver waits for one bucket (ray.get timeout) before the "
        "fetch fails with WeightSyncError",
    )
    reuse_receive_buffers: bool = Field(
        True,
        description="a receiver copies each bucket into a buffer it keeps and reuses for "
        "the next version once no tensor of the last one is held (no fresh pages per "
        "update); costs one version's bytes kept in the engine process between updates. "
        "false: a new buffer every time",
    )


@dataclass
class PackedBucket:
    """A :class:`WeightBucket` as the object store holds it: per tensor its name, dtype
    (``torch.<dtype>``'s name), shape and bytes (a flat ``uint8`` numpy array, which Ray
    stores out of band)."""

    version: int
    index: int
    checksum: str
    names: list[str]
    dtypes: list[str]
    shapes: list[tuple[int, ...]]
    data: list[np.ndarray]


def pack(bucket: WeightBucket) -> PackedBucket:
    """``bucket`` with each tensor's bytes viewed (no copy) as a numpy array."""
    import torch

    names, dtypes, shapes, data = [], [], [], []
    for name, tensor in bucket.tensors.items():
        t = tensor.detach().to("cpu").contiguous()
        names.append(name)
        dtypes.append(str(t.dtype).removeprefix("torch."))
        shapes.append(tuple(t.shape))
        data.append(t.reshape(-1).view(torch.uint8).numpy())
    return PackedBucket(bucket.version, bucket.index, bucket.checksum, names, dtypes,
                        shapes, data)


ALIGN = 64  # each tensor's offset in a receive buffer (any dtype's alignment, SIMD's too)


def packed_nbytes(packed: PackedBucket) -> int:
    """Bytes of the buffer :func:`unpack` copies ``packed`` into (offsets aligned)."""
    return sum(-(-int(a.size) // ALIGN) * ALIGN for a in packed.data)


def unpack(packed: PackedBucket, into: Any = None) -> WeightBucket:
    """The bucket back, each tensor a view of one flat ``uint8`` buffer the caller owns
    (the store's buffers are read-only and shared): ``into`` (at least
    :func:`packed_nbytes` bytes; a receiver's reused buffer) or a new one."""
    import torch

    flat = into if into is not None else torch.empty(packed_nbytes(packed), dtype=torch.uint8)
    arr = flat.numpy()
    tensors = {}
    off = 0
    for name, dtype, shape, data in zip(packed.names, packed.dtypes, packed.shapes,
                                        packed.data, strict=True):
        n = int(data.size)
        arr[off:off + n] = data
        tensors[name] = flat[off:off + n].view(getattr(torch, dtype)).reshape(shape)
        off += -(-n // ALIGN) * ALIGN
    return WeightBucket(packed.version, packed.index, tensors, packed.checksum)


def _storage_refs(tensor: Any) -> int | None:
    """References to ``tensor``'s memory (its storage's use count: one per tensor or view
    of it, numpy arrays of them included), or None where this torch cannot say."""
    import torch

    count = getattr(torch._C, "_storage_Use_Count", None)
    if count is None:
        return None
    storage = tensor.untyped_storage()  # kept alive while counted
    return int(count(storage._cdata))


def _unused(buffer: Any) -> bool:
    """Whether nothing but ``buffer`` itself refers to its memory: every tensor handed out
    as a view of it (and every view or numpy array of those) is gone. False where this
    torch cannot tell (then a receiver never reuses)."""
    import torch

    global _ALONE
    if _ALONE is None:  # the count of a tensor nobody else refers to, on this torch
        probe = torch.empty(1, dtype=torch.uint8)
        _ALONE = _storage_refs(probe) or 0
    refs = _storage_refs(buffer)
    return refs is not None and _ALONE > 0 and refs <= _ALONE


_ALONE: int | None = None


def _ray() -> Any:
    """Import ray and insist on a connected driver/worker (a clear error otherwise)."""
    import ray

    if not ray.is_initialized():
        raise RuntimeError(
            "the 'ray' weight transport needs a running Ray: call "
            "rollart_sdk.ray_utils.init_ray() first (inside Ray actors it already is)"
        )
    return ray


def _kv() -> Any:
    from ray.experimental import internal_kv

    return internal_kv


def _live_key(sender: str, version: int) -> bytes:
    return f"transport/ray/{sender}/{version}".encode()


def _get(handle: Any, timeout_s: float) -> Any:
    """``ray.get`` with a timeout, through the ref's future.

    Engine workers are async actors and fetch runs in a stager's background thread; a
    plain ``ray.get`` there is fine but makes Ray warn that it "blocks the event loop".
    """
    future = handle.future()
    try:
        return future.result(timeout=timeout_s)
    except concurrent.futures.TimeoutError:  # not the builtin TimeoutError before 3.11
        future.cancel()
        raise TimeoutError(f"no result within {timeout_s}s") from None


class RayObjectStoreTransport:
    """:class:`rollart_sdk.interfaces.WeightTransport` over Ray's object store (pull).

    Factory call: ``RayObjectStoreTransport(role="sender"|"receiver", keep_versions=3,
    fetch_timeout_s=300.0, reuse_receive_buffers=True)``. Only a sender may ``publish``
    and ``release``; any role may ``fetch``.
    """

    style: ClassVar[Literal["push", "pull"]] = "pull"

    def __init__(
        self,
        role: str = "sender",
        keep_versions: int = 3,
        fetch_timeout_s: float = 300.0,
        reuse_receive_buffers: bool = True,
    ) -> None:
        if role not in ("sender", "receiver"):
            raise ValueError(f"role must be 'sender' or 'receiver', got {role!r}")
        opts = RayTransportOptions(keep_versions=keep_versions, fetch_timeout_s=fetch_timeout_s,
                                   reuse_receive_buffers=reuse_receive_buffers)
        self.role = role
        self.keep_versions = opts.keep_versions
        self.fetch_timeout_s = opts.fetch_timeout_s
        self.reuse_receive_buffers = opts.reuse_receive_buffers
        # Receiver: (bucket index, bytes) -> the buffer that bucket was last copied into.
        # A superseded fetch may still run in its thread beside the next one (the stager
        # does not wait for it): whether a buffer is free is decided, and the copy made,
        # under the lock, while the other fetch's copies are views that count.
        self._buffers: dict[tuple[int, int], Any] = {}
        self._buffers_lock = threading.Lock()
        self.sender_id = uuid.uuid4().hex[:16]
        # version -> the ObjectRefs that keep its buckets alive, oldest first.
        self._published: OrderedDict[int, list[Any]] = OrderedDict()

    # -- sender side ---------------------------------------------------------------
    @property
    def published_versions(self) -> list[int]:
        """Versions this sender still keeps fetchable, oldest first."""
        return list(self._published)

    def publish(self, version: int, buckets: Iterable[WeightBucket]) -> WeightManifest:
        """Put every bucket into the object store once; returns at once with the manifest.

        A bucket's ``checksum`` (computed at export) is trusted and carried to receivers,
        which verify the bytes they get against it; an empty one is computed here.
        """
        self._require_sender("publish")
        ray = _ray()
        if self._published and version <= next(reversed(self._published)):
            raise ValueError(
                f"publish(version={version}): versions must increase; this sender already "
                f"published {next(reversed(self._published))}"
            )
        refs = []
        handles: list[Any] = []
        for bucket in buckets:
            if bucket.version != version:
                raise ValueError(
                    f"publish(version={version}) got bucket {bucket.index} of version "
                    f"{bucket.version}; export buckets with the version being published"
                )
            entry = bucket_ref(bucket)  # fills bucket.checksum when empty
            entry.handle = ray.put(pack(bucket))
            handles.append(entry.handle)
            refs.append(entry)
        if not refs:
            raise ValueError(f"publish(version={version}) got no buckets")
        self._published[version] = handles
        _kv()._internal_kv_put(
            _live_key(self.sender_id, version), b"1", overwrite=True, namespace=_KV_NAMESPACE
        )
        for old in list(self._published)[: -self.keep_versions]:
            self.release(old)
        return WeightManifest(
            version=version,
            transport=TRANSPORT_NAME,
            buckets=refs,
            meta={"sender": self.sender_id, "keep_versions": self.keep_versions},
        )

    def release(self, version: int) -> None:
        """Make ``version`` unfetchable and drop the sender's refs (no-op if unknown)."""
        self._require_sender("release")
        handles = self._published.pop(version, None)
        if handles is None:
            return
        handles.clear()
        import ray

        if ray.is_initialized():
            _kv()._internal_kv_del(
                _live_key(self.sender_id, version), namespace=_KV_NAMESPACE
            )

    def close(self) -> None:
        """Release every version this sender still holds (a receiver holds nothing)."""
        if self.role == "sender":
            for version in list(self._published):
                self.release(version)

    # -- receiver side -------------------------------------------------------------
    def fetch(self, manifest: WeightManifest) -> Iterator[WeightBucket]:
        """Yield each bucket of ``manifest`` whole and verified, or raise WeightSyncError."""
        _ray()
        from ray.exceptions import GetTimeoutError, ObjectLostError, RayError

        version = manifest.version
        if manifest.transport != TRANSPORT_NAME:
            raise WeightSyncError(
                version,
                f"manifest was published by transport {manifest.transport!r}, this is "
                f"{TRANSPORT_NAME!r}; configure the same transport for trainer and engines",
            )
        sender = manifest.meta.get("sender")
        if not sender:
            raise WeightSyncError(
                version, "manifest has no meta['sender']; it was not made by publish()"
            )
        if not _kv()._internal_kv_exists(_live_key(sender, version), namespace=_KV_NAMESPACE):
            raise WeightSyncError(
                version,
                f"version {version} was released by its sender (it keeps the newest "
                f"{manifest.meta.get('keep_versions')} versions, keep_versions) or the "
                "sender closed; fetch the newest manifest instead",
            )
        used: set[tuple[int, int]] = set()
        for ref in manifest.buckets:
            if ref.handle is None:
                raise WeightSyncError(
                    version, "manifest entry has no ObjectRef handle", ref.index
                )
            try:
                bucket = _get(ref.handle, self.fetch_timeout_s)
            except (GetTimeoutError, TimeoutError):
                raise WeightSyncError(
                    version,
                    f"ray.get timed out after {self.fetch_timeout_s:g}s "
                    "(transport option fetch_timeout_s); is the object store overloaded "
                    "or the sender's node gone?",
                    ref.index,
                ) from None
            except ObjectLostError as exc:
                raise WeightSyncError(
                    version,
                    f"bucket is gone from Ray's object store ({type(exc).__name__}): the "
                    "sender released it or its process died; fetch a newer manifest",
                    ref.index,
                ) from exc
            except RayError as exc:
                raise WeightSyncError(
                    version, f"ray.get failed: {type(exc).__name__}: {exc}", ref.index
                ) from exc
            if isinstance(bucket, PackedBucket):
                bucket = self._unpack(ref.index, bucket, used)
            elif not isinstance(bucket, WeightBucket):  # a plain bucket is read as it is
                raise WeightSyncError(
                    version,
                    f"object store entry holds {type(bucket).__name__}, not a bucket",
                    ref.index,
                )
            verify(bucket, ref, version)
            yield bucket
        with self._buffers_lock:
            for key in set(self._buffers) - used:  # a layout this receiver no longer gets
                del self._buffers[key]

    def _unpack(self, index: int, packed: PackedBucket,
                used: set[tuple[int, int]]) -> WeightBucket:
        """``packed`` copied into this receiver's buffer for the bucket when nothing holds
        a tensor of its last version any more, else into a new one (kept for next time)."""
        if not self.reuse_receive_buffers:
            return unpack(packed)
        import torch

        key = (index, packed_nbytes(packed))
        used.add(key)
        with self._buffers_lock:
            buffer = self._buffers.get(key)
            if buffer is None or not _unused(buffer):
                buffer = self._buffers[key] = torch.empty(key[1], dtype=torch.uint8)
            return unpack(packed, into=buffer)

    def _require_sender(self, what: str) -> None:
        if self.role != "sender":
            raise RuntimeError(
                f"{what}() is for the trainer-side transport; this one was created with "
                f"role={self.role!r}"
            )
