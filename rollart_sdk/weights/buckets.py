"""Weight buckets: checksums, splitting a state dict into size-bounded buckets, manifests.

Shared by every trainer (export), transport (publish / verify) and engine worker (staging)
so that a checksum computed on one side is checked identically on the other, and so that
every transport fails in the same, catchable way (:class:`WeightSyncError`). torch is
imported lazily.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from typing import Any

from rollart_sdk.errors import RollartError
from rollart_sdk.types import BucketRef, WeightBucket, WeightManifest


class WeightSyncError(RollartError):
    """A policy version's weights could not be delivered to an engine worker.

    Raised by transports (``fetch``: missing, released, timed-out or corrupt bucket) and by
    :class:`rollart_sdk.weights.WeightStager` (``commit``). Whoever catches it knows the
    engine was not touched: it keeps serving ``version - 1`` (or whatever it had), never a
    mix of two versions. ``bucket`` is the bucket index when one bucket is to blame.
    """

    def __init__(self, version: int, reason: str, bucket: int | None = None) -> None:
        self.version = version
        self.reason = reason
        self.bucket = bucket
        where = f"bucket {bucket} of " if bucket is not None else ""
        super().__init__(f"weight sync of {where}version {version} failed: {reason}")

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled with its own arguments (Ray sends it from an engine to the driver).
        return (type(self), (self.version, self.reason, self.bucket))


class CorruptBucketError(WeightSyncError, ValueError):
    """A bucket's bytes do not match its checksum (also a ``ValueError``, as it always was)."""


# The checksum every publisher writes: xxh3-128 (the ``xxhash`` package), about 10x
# sha256's speed here (16 against 1.6 GB/s: SmolLM2-135M's 651 MB in 0.04 s instead of
# 0.43 s, once on each side of every update). It guards against transfer damage, a
# stale or mixed-up bucket and a trainer writing the tensors after it published them,
# not against someone forging a bucket. Receivers take the algorithm from the expected
# string, so a bare sha256 hex digest (the format before December 2026) still verifies.
CHECKSUM_ALGORITHMS = ("xxh3-128", "sha256")
DEFAULT_CHECKSUM = "xxh3-128"


def checksum(tensors: dict[str, Any], algorithm: str = DEFAULT_CHECKSUM) -> str:
    """A digest of each tensor's name, dtype, shape and raw bytes, in name order:
    ``"xxh3-128:<hex>"`` (default), or with ``algorithm="sha256"`` the bare sha256 hex
    digest (the older format)."""
    import torch

    if algorithm == "xxh3-128":
        import xxhash

        h: Any = xxhash.xxh3_128()
    elif algorithm == "sha256":
        h = hashlib.sha256()
    else:
        raise ValueError(f"unknown checksum algorithm {algorithm!r}; "
                         f"known: {', '.join(CHECKSUM_ALGORITHMS)}")
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        h.update(name.encode())
        h.update(str(t.dtype).encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.view(-1).view(torch.uint8).numpy())  # the buffer itself, no copy
    digest = str(h.hexdigest())
    return digest if algorithm == "sha256" else f"{algorithm}:{digest}"


def checksum_algorithm(expected: str) -> str:
    """The algorithm a checksum string was made with (``"xxh3-128:..."``; a bare hex
    digest is sha256's)."""
    algorithm, sep, _ = expected.partition(":")
    return algorithm if sep else "sha256"


def without_aliases(named_tensors: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
    """``named_tensors`` less every tensor that is a view of one already given (same
    storage, offset, shape and strides): a ``state_dict`` of a model with tied word
    embeddings (SmolLM2, Qwen3 up to 4B, Llama 3.2) lists the embedding twice, as
    ``model.embed_tokens.weight`` and ``lm_head.weight``, and an update would carry it
    twice (17 % of SmolLM2-135M's bytes, a fifth of Qwen3-0.6B's). The receiving model
    ties them again: loading the embedding sets both (an engine whose loader needs the
    head's name too adds it on its side, as vLLM's worker does: ``with_tied_head``)."""
    seen: set[tuple[Any, ...]] = set()
    for name, tensor in named_tensors:
        try:
            key = (tensor.device, tensor.untyped_storage().data_ptr(), tensor.storage_offset(),
                   tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype)
        except (AttributeError, RuntimeError):  # not a strided torch tensor: keep it
            yield name, tensor
            continue
        if key[1] and key in seen:
            continue
        seen.add(key)
        yield name, tensor


def split_buckets(
    named_tensors: Iterable[tuple[str, Any]], bucket_bytes: int, version: int
) -> Iterator[WeightBucket]:
    """Group tensors in order into buckets of at most ``bucket_bytes`` (a tensor larger
    than the bound gets a bucket of its own); each bucket carries its checksum."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    current: dict[str, Any] = {}
    size = 0
    index = 0
    for name, tensor in named_tensors:
        t = tensor.detach().contiguous().cpu()
        n = int(t.numel()) * int(t.element_size())
        if current and size + n > bucket_bytes:
            yield WeightBucket(version, index, current, checksum(current))
            index += 1
            current, size = {}, 0
        current[name] = t
        size += n
    if current:
        yield WeightBucket(version, index, current, checksum(current))


def verify(
    bucket: WeightBucket, ref: BucketRef | None = None, version: int | None = None
) -> None:
    """Raise :class:`CorruptBucketError` (a ``ValueError``) when a bucket's content does
    not match its checksum.

    With ``ref`` (the manifest's entry) the checksum checked against is the manifest's, the
    one the publisher computed, so a bucket whose own ``checksum`` field was damaged or
    rewritten is caught too; index and tensor names must match the entry. With ``version``
    the bucket must belong to that policy version (a stale bucket is as bad as a corrupt
    one: loading it would mix two versions).
    """
    if version is not None and bucket.version != version:
        raise CorruptBucketError(
            version,
            f"received a bucket of version {bucket.version} (a stale or mixed-up transfer); "
            "the engine keeps its current weights",
            bucket.index,
        )
    expected = bucket.checksum
    if ref is not None:
        if bucket.index != ref.index:
            raise CorruptBucketError(
                bucket.version, f"expected bucket index {ref.index}, got {bucket.index}",
                ref.index,
            )
        if sorted(bucket.tensors) != sorted(ref.names):
            missing = sorted(set(ref.names) - set(bucket.tensors))
            extra = sorted(set(bucket.tensors) - set(ref.names))
            raise CorruptBucketError(
                bucket.version,
                f"tensor names differ from the manifest (missing {missing[:5]}, "
                f"unexpected {extra[:5]})",
                bucket.index,
            )
        expected = ref.checksum
    if not expected:
        raise CorruptBucketError(
            bucket.version,
            "it carries no checksum; publishers must fill WeightBucket.checksum "
            "(rollart_sdk.weights.checksum or split_buckets do)",
            bucket.index,
        )
    algorithm = checksum_algorithm(expected)
    if algorithm not in CHECKSUM_ALGORITHMS:
        raise CorruptBucketError(
            bucket.version,
            f"its checksum {expected[:24]!r} is of an unknown algorithm {algorithm!r} "
            f"(known: {', '.join(CHECKSUM_ALGORITHMS)}); sender and receiver run different "
            "rollart-sdk versions: install the same one on both",
            bucket.index,
        )
    actual = checksum(bucket.tensors, algorithm)
    if actual != expected:
        raise CorruptBucketError(
            bucket.version,
            f"weight bucket {bucket.index} of version {bucket.version} is corrupt: "
            f"checksum {actual[:12]} != expected {expected[:12]}",
            bucket.index,
        )


def bucket_ref(bucket: WeightBucket, handle: Any = None) -> BucketRef:
    """The manifest entry of ``bucket`` (its checksum is computed when still empty)."""
    if not bucket.checksum:
        bucket.checksum = checksum(bucket.tensors)
    return BucketRef(
        index=bucket.index,
        names=list(bucket.tensors),
        nbytes=bucket.nbytes,
        checksum=bucket.checksum,
        handle=handle,
    )


def plan_manifest(
    version: int, transport: str, buckets: Iterable[WeightBucket], **meta: Any
) -> WeightManifest:
    """A manifest known before anything is sent (every ``handle`` is None).

    Push-style transports need it: their receivers ``fetch`` concurrently with the
    sender's ``publish``, so the receivers cannot wait for ``publish`` to return one.
    """
    return WeightManifest(
        version=version,
        transport=transport,
        buckets=[bucket_ref(b) for b in buckets],
        meta=dict(meta),
    )


def check_complete(manifest: WeightManifest, buckets: list[WeightBucket]) -> None:
    """Raise :class:`WeightSyncError` unless ``buckets`` is exactly the manifest's set:
    every index once, of the manifest's version, names and checksum as listed.

    Cheap (no hashing): the guard a receiver runs before swapping weights in, so that an
    incomplete or mixed transfer never reaches an engine.
    """
    by_index = {b.index: b for b in buckets}
    expected = {r.index for r in manifest.buckets}
    if len(by_index) != len(buckets):
        raise WeightSyncError(manifest.version, "a bucket index was received twice")
    missing = sorted(expected - set(by_index))
    if missing:
        raise WeightSyncError(
            manifest.version,
            f"{len(missing)} of {len(expected)} buckets never arrived (indices {missing[:8]})",
        )
    extra = sorted(set(by_index) - expected)
    if extra:
        raise WeightSyncError(manifest.version, f"unexpected bucket indices {extra[:8]}")
    for ref in manifest.buckets:
        b = by_index[ref.index]
        if b.version != manifest.version:
            raise WeightSyncError(
                manifest.version, f"bucket carries version {b.version}", ref.index
            )
        if sorted(b.tensors) != sorted(ref.names):
            raise WeightSyncError(
                manifest.version, "bucket's tensor names differ from the manifest", ref.index
            )
        if b.checksum and b.checksum != ref.checksum:
            raise WeightSyncError(
                manifest.version, "bucket's checksum differs from the manifest", ref.index
            )
