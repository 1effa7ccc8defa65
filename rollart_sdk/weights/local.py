"""The built-in ``local`` weight transport: publish/pull inside one process.

For runs and tests where the trainer and the engines live in the same process (the
control plane's in-process tests, notebooks). Buckets are kept by reference in a
process-wide store; a receiver in another process finds nothing and says so.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from rollart_sdk.types import BucketRef, WeightBucket, WeightManifest
from rollart_sdk.weights.buckets import verify

_STORE: dict[tuple[str, int], list[WeightBucket]] = {}
_LOCK = threading.Lock()


class LocalTransportOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    channel: str = Field("default", description="name shared by the sender and its receivers")
    keep_versions: int = Field(3, ge=1, description="published versions kept before release "
                               "(3: the version the engines serve, the one they receive and "
                               "the one just published; a restarted engine reloads the first)")


class LocalTransport:
    style: ClassVar[Literal["push", "pull"]] = "pull"

    def __init__(self, role: str = "sender", channel: str = "default", keep_versions: int = 3) -> None:
        self.role = role
        self.channel = channel
        self.keep_versions = keep_versions
        self._published: list[int] = []
        if role == "sender":  # a new sender owns its channel: drop a previous run's versions
            self.close()

    def publish(self, version: int, buckets: Iterable[WeightBucket]) -> WeightManifest:
        stored = list(buckets)
        with _LOCK:
            _STORE[(self.channel, version)] = stored
            self._published.append(version)
            for old in self._published[: -self.keep_versions]:
                _STORE.pop((self.channel, old), None)
            self._published = self._published[-self.keep_versions :]
        refs = [BucketRef(b.index, sorted(b.tensors), b.nbytes, b.checksum, handle=b.index)
                for b in stored]
        return WeightManifest(version, "local", refs, meta={"channel": self.channel})

    def fetch(self, manifest: WeightManifest) -> Iterator[WeightBucket]:
        key = (manifest.meta.get("channel", self.channel), manifest.version)
        with _LOCK:
            stored = _STORE.get(key)
        if stored is None:
            raise LookupError(
                f"local transport: version {manifest.version} of channel {key[0]!r} is not "
                "published in this process (released, or the sender runs elsewhere: use a "
                "cross-process transport such as 'ray')"
            )
        for ref in manifest.buckets:
            bucket = stored[ref.handle]
            verify(bucket)
            yield bucket

    def release(self, version: int) -> None:
        with _LOCK:
            _STORE.pop((self.channel, version), None)

    def close(self) -> None:
        if self.role == "sender":
            with _LOCK:
                for key in [k for k in _STORE if k[0] == self.channel]:
                    _STORE.pop(key, None)

