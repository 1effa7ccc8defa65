"""Weight transport ``example``: moves a policy version's buckets from the trainer to
every engine worker.

This template keeps buckets in a process-wide dict, so it works only when the trainer and
the engines share one process (it registers with ``process_local=True``, and ``rollart
validate`` refuses it for a Ray run): replace ``_STORE`` with a channel between processes
(a store, a collective, RDMA) and drop that flag. ``tests/test_example.py`` runs rollart's
conformance kit (``check_transport``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from rollart_sdk.types import BucketRef, WeightBucket, WeightManifest
from rollart_sdk.weights import WeightSyncError, verify

_STORE: dict[tuple[str, int], list[WeightBucket]] = {}
_LOCK = threading.Lock()


class ExampleOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    channel: str = Field("default", description="name shared by the sender and its receivers")
    keep_versions: int = Field(3, ge=1, description="published versions kept before release "
                               "(3: served, being received, just published; a restarted "
                               "engine reloads the served one)")


class ExampleTransport:
    style: ClassVar[Literal["push", "pull"]] = "pull"

    def __init__(self, role: str = "sender", channel: str = "default",
                 keep_versions: int = 3) -> None:
        self.role = role
        self.channel = channel
        self.keep_versions = keep_versions
        self._published: list[int] = []

    def publish(self, version: int, buckets: Iterable[WeightBucket]) -> WeightManifest:
        stored = list(buckets)
        with _LOCK:
            _STORE[(self.channel, version)] = stored
            self._published.append(version)
            for old in self._published[: -self.keep_versions]:
                _STORE.pop((self.channel, old), None)
            self._published = self._published[-self.keep_versions:]
        refs = [BucketRef(b.index, sorted(b.tensors), b.nbytes, b.checksum, handle=b.index)
                for b in stored]
        return WeightManifest(version, "example", refs, meta={"channel": self.channel})

    def fetch(self, manifest: WeightManifest) -> Iterator[WeightBucket]:
        with _LOCK:
            stored = _STORE.get((manifest.meta.get("channel", self.channel), manifest.version))
        if stored is None:
            raise WeightSyncError(manifest.version, "not published, or already released")
        for ref in manifest.buckets:
            bucket = stored[ref.handle]
            verify(bucket, ref, manifest.version)  # a corrupt bucket raises, never loads
            yield bucket

    def release(self, version: int) -> None:
        with _LOCK:
            _STORE.pop((self.channel, version), None)

    def close(self) -> None:
        pass
