"""Weight movement, in one place: buckets and checksums, staging inside an engine worker,
the built-in ``local`` transport, and the driver's coordinator that stages and commits a
version on every engine.

- :mod:`~rollart_sdk.weights.buckets`: ``checksum``, ``split_buckets``, ``verify``,
  ``bucket_ref``, ``plan_manifest``, ``check_complete`` and :class:`WeightSyncError`
  (shared by every trainer, transport and engine worker);
- :mod:`~rollart_sdk.weights.staging`: :class:`WeightStager` (receive in the background,
  swap at the suspend point);
- :mod:`~rollart_sdk.weights.local`: :class:`LocalTransport` (registered as ``local`` by
  ``rollart_sdk.default_plugins.transports``);
- :mod:`~rollart_sdk.weights.sync`: :class:`WeightSync` (the control plane's side).

Plugins import from this package (``from rollart_sdk.weights import split_buckets``).
"""

from rollart_sdk.weights.buckets import (
    CorruptBucketError,
    WeightSyncError,
    bucket_ref,
    check_complete,
    checksum,
    plan_manifest,
    split_buckets,
    verify,
    without_aliases,
)
from rollart_sdk.weights.local import LocalTransport, LocalTransportOptions
from rollart_sdk.weights.staging import WeightLoader, WeightStager
from rollart_sdk.weights.sync import WeightSync

__all__ = [
    "CorruptBucketError",
    "LocalTransport",
    "LocalTransportOptions",
    "WeightLoader",
    "WeightStager",
    "WeightSync",
    "WeightSyncError",
    "bucket_ref",
    "check_complete",
    "checksum",
    "plan_manifest",
    "split_buckets",
    "verify",
    "without_aliases",
]
