"""What goes over the wire for one version: a JSON header, then one flat buffer per dtype
per bucket.

Each bucket's tensors are grouped by dtype and concatenated into one flat tensor per
group (a copy: the trainer may step on while the broadcast runs); each flat tensor travels
as its raw bytes (a ``uint8`` view), so any dtype broadcasts the same way on NCCL and
gloo. The header says how to cut the bytes back into named tensors; receivers check it
against the manifest they were given before trusting it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from rollart_sdk.types import WeightBucket, WeightManifest
from rollart_sdk.weights import WeightSyncError


@dataclass
class Packed:
    """One version ready to broadcast: its header and its flat buffers, in send order."""

    version: int
    header: bytes
    flats: list[Any]  # uint8 tensors, one per (bucket, dtype) group with bytes

    @property
    def nbytes(self) -> int:
        return sum(int(f.numel()) for f in self.flats)


def _dtype(name: str) -> Any:
    import torch

    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r} in a weight header")
    return dtype


def pack(version: int, buckets: Iterable[WeightBucket], device: Any = "cpu") -> Packed:
    """Flatten every bucket per dtype (copies on ``device``) and describe it in a header."""
    import torch

    entries: list[dict[str, Any]] = []
    flats: list[Any] = []
    for bucket in buckets:
        groups: dict[str, list[tuple[str, Any]]] = {}
        for name, tensor in bucket.tensors.items():
            groups.setdefault(str(tensor.dtype), []).append((name, tensor))
        layout = []
        for dtype, members in groups.items():
            parts = [t.detach().reshape(-1) for _, t in members]
            flat = torch.cat(parts) if parts else torch.empty(0)
            raw = flat.to(device).contiguous().view(torch.uint8).reshape(-1)
            if raw.numel():
                flats.append(raw)
            layout.append({
                "dtype": dtype,
                "nbytes": int(raw.numel()),
                "tensors": [[name, list(t.shape)] for name, t in members],
            })
        entries.append({"index": bucket.index, "version": bucket.version,
                        "checksum": bucket.checksum, "groups": layout})
    header = json.dumps({"version": version, "buckets": entries}).encode()
    return Packed(version, header, flats)


def plan(header: dict[str, Any], device: Any = "cpu") -> list[Any]:
    """Empty receive buffers for every flat buffer the header announces, in send order."""
    import torch

    return [
        torch.empty(group["nbytes"], dtype=torch.uint8, device=device)
        for entry in header["buckets"]
        for group in entry["groups"]
        if group["nbytes"]
    ]


def check_header(header: dict[str, Any], manifest: WeightManifest) -> None:
    """Raise WeightSyncError unless the header announces exactly the manifest's version."""
    v = manifest.version
    if header.get("version") != v:
        raise WeightSyncError(
            v, f"the sender is broadcasting version {header.get('version')}, not {v} "
            "(a stale or out-of-order round); the engine keeps its weights",
        )
    got = {e["index"]: sorted(n for g in e["groups"] for n, _ in g["tensors"])
           for e in header["buckets"]}
    for ref in manifest.buckets:
        if ref.index not in got:
            raise WeightSyncError(v, "the sender does not send this bucket", ref.index)
        if got[ref.index] != sorted(ref.names):
            raise WeightSyncError(
                v, "the sender's tensor names differ from the manifest", ref.index
            )


def unpack(header: dict[str, Any], flats: list[Any]) -> list[WeightBucket]:
    """Cut the received flat buffers back into named tensors (views, no copy)."""
    import math

    import torch

    buckets: list[WeightBucket] = []
    it = iter(flats)
    for entry in header["buckets"]:
        tensors: dict[str, Any] = {}
        for group in entry["groups"]:
            dtype = _dtype(group["dtype"])
            raw = next(it) if group["nbytes"] else torch.empty(0, dtype=torch.uint8)
            typed = raw.view(dtype)
            offset = 0
            for name, shape in group["tensors"]:
                n = math.prod(shape)
                tensors[name] = typed[offset : offset + n].view(shape)
                offset += n
        buckets.append(WeightBucket(entry["version"], entry["index"], tensors,
                                    entry["checksum"]))
    return buckets
