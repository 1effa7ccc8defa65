"""Weight buckets: checksums and splitting a state dict into size-bounded buckets.

Shared by every trainer (export) and transport (verify) so that a checksum computed on
one side is checked identically on the other. torch is imported lazily.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from typing import Any

from rollart_sdk.types import WeightBucket


def checksum(tensors: dict[str, Any]) -> str:
    """sha256 over each tensor's name, dtype, shape and raw bytes, in name order."""
    import torch

    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        h.update(name.encode())
        h.update(str(t.dtype).encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


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


def verify(bucket: WeightBucket) -> None:
    """Raise ValueError when a bucket's content does not match its checksum."""
    actual = checksum(bucket.tensors)
    if actual != bucket.checksum:
        raise ValueError(
            f"weight bucket {bucket.index} of version {bucket.version} is corrupt: "
            f"checksum {actual[:12]} != expected {bucket.checksum[:12]}"
        )
