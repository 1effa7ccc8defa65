"""The conformance kit itself: it passes a good push transport and fails broken ones.

A kit that cannot fail proves nothing, so each broken transport here (real subclasses of
the Ray transport with one promise removed) must make ``check_transport`` raise.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any, ClassVar, Literal

import pytest
import ray
import torch
from rollart_transport_ray.transport import RayObjectStoreTransport, unpack

from rollart_sdk.ray_utils import init_ray
from rollart_sdk.testing.transport import check_transport
from rollart_sdk.types import WeightBucket, WeightManifest
from rollart_sdk.weights import plan_manifest, verify


class QueueLink:
    """What a collective's process group is to NCCL: the wiring shared by both sides."""

    def __init__(self) -> None:
        self.queues: list[queue.Queue] = []
        self.acks: queue.Queue = queue.Queue()


class QueuePushTransport:
    """An in-process push transport: ``publish`` hands every bucket to every receiver and
    returns only once all of them took every bucket (a broadcast's completion)."""

    style: ClassVar[Literal["push", "pull"]] = "push"

    def __init__(self, link: QueueLink, role: str, verify_buckets: bool = True,
                 timeout_s: float = 10.0) -> None:
        self.link, self.role, self.verify_buckets = link, role, verify_buckets
        self.timeout_s = timeout_s
        if role == "receiver":
            self.inbox: queue.Queue = queue.Queue()
            link.queues.append(self.inbox)

    def publish(self, version: int, buckets: Iterable[WeightBucket]) -> WeightManifest:
        buckets = list(buckets)
        for bucket in buckets:
            for inbox in self.link.queues:
                copy = {k: v.clone() for k, v in bucket.tensors.items()}
                inbox.put(WeightBucket(bucket.version, bucket.index, copy, bucket.checksum))
        deadline = time.monotonic() + self.timeout_s
        for _ in range(len(buckets) * len(self.link.queues)):
            self.link.acks.get(timeout=max(0.0, deadline - time.monotonic()))
        return plan_manifest(version, "queue", buckets)

    def fetch(self, manifest: WeightManifest) -> Iterator[WeightBucket]:
        for ref in manifest.buckets:
            while True:
                bucket = self.inbox.get(timeout=self.timeout_s)
                self.link.acks.put(1)
                if bucket.version >= manifest.version:  # skip leftovers of older versions
                    break
            if self.verify_buckets:
                verify(bucket, ref, manifest.version)
            yield bucket

    def release(self, version: int) -> None:
        """Nothing is stored: a push transport holds no versions."""

    def close(self) -> None:
        """Nothing to close: the queues go with the link."""


def test_kit_passes_a_push_transport_fetching_concurrently_with_publish():
    link = QueueLink()
    summary = check_transport(
        lambda: QueuePushTransport(link, "sender"),
        lambda: QueuePushTransport(link, "receiver"),
        num_receivers=3,
        name="queue",
    )
    assert summary["style"] == "push" and summary["versions"] == [1, 2]
    assert summary["corrupt_rejected"] == "fetch"


def test_kit_needs_the_name_of_a_push_transport():
    link = QueueLink()
    with pytest.raises(ValueError, match="name="):
        check_transport(lambda: QueuePushTransport(link, "sender"),
                        lambda: QueuePushTransport(link, "receiver"))


def test_kit_fails_a_push_transport_that_skips_verification():
    link = QueueLink()
    with pytest.raises(AssertionError, match="corrupt bucket of version 3"):
        check_transport(
            lambda: QueuePushTransport(link, "sender"),
            lambda: QueuePushTransport(link, "receiver", verify_buckets=False),
            name="queue",
        )


# -- broken pull transports (the real Ray one, with a promise removed) ---------------------
class NoVerify(RayObjectStoreTransport):
    def fetch(self, manifest: WeightManifest) -> Iterator[WeightBucket]:
        for ref in manifest.buckets:
            yield unpack(ray.get(ref.handle))


class NoRelease(RayObjectStoreTransport):
    def release(self, version: int) -> None:
        """Forgets to make the version unfetchable."""


class LosesDtype(RayObjectStoreTransport):
    def fetch(self, manifest: WeightManifest) -> Iterator[WeightBucket]:
        for bucket in super().fetch(manifest):
            tensors: dict[str, Any] = {
                k: (v.float() if v.dtype == torch.bfloat16 else v)
                for k, v in bucket.tensors.items()
            }
            yield WeightBucket(bucket.version, bucket.index, tensors, bucket.checksum)


@pytest.fixture(scope="module")
def ray_session():
    torch.set_num_threads(1)
    init_ray(num_cpus=1)
    yield
    ray.shutdown()


@pytest.mark.parametrize(
    "receiver_cls, sender_cls, message",
    [
        (NoVerify, RayObjectStoreTransport, "corrupt bucket of version 3"),
        (RayObjectStoreTransport, NoRelease, "released version"),
        (LosesDtype, RayObjectStoreTransport, "arrived as torch.float32"),
    ],
    ids=["no-verify", "no-release", "loses-dtype"],
)
def test_kit_fails_broken_pull_transports(ray_session, receiver_cls, sender_cls, message):
    before = threading.active_count()  # earlier tests in this process may have left some
    with pytest.raises(AssertionError, match=message):
        check_transport(lambda: sender_cls("sender"),
                        lambda: receiver_cls("receiver", fetch_timeout_s=20))
    assert threading.active_count() - before < 10  # stagers' threads do not pile up


def test_kit_fails_a_pull_transport_that_keeps_too_few_versions(ray_session):
    """Two kept versions lose the served one when, with deferred updates, one newer version
    is being received and another is published: a restarted engine could not reload."""
    summary = check_transport(lambda: RayObjectStoreTransport("sender"),
                              lambda: RayObjectStoreTransport("receiver", fetch_timeout_s=20))
    assert summary["served_kept"] == 4  # the default (3) keeps it
    with pytest.raises(AssertionError, match="could not reload the served version 4"):
        check_transport(lambda: RayObjectStoreTransport("sender", keep_versions=2),
                        lambda: RayObjectStoreTransport("receiver", fetch_timeout_s=20))
