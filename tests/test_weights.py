"""rollart_sdk.weights: checksums, bucket splitting, verification and manifests."""

from __future__ import annotations

import pytest
import torch

from rollart_sdk.errors import RollartError
from rollart_sdk.types import WeightBucket
from rollart_sdk.weights import (
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


def state(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "a": torch.randn(10, 10, generator=g),  # 400 B
        "b": torch.randn(5, generator=g).to(torch.bfloat16),  # 10 B
        "c": torch.randn(100, 10, generator=g),  # 4000 B: larger than the bound below
        "d": torch.arange(7),  # 56 B
    }


def test_checksum_covers_names_dtypes_shapes_and_bytes():
    base = state()
    ref = checksum(base)
    assert ref == checksum(dict(reversed(list(base.items()))))  # insertion order irrelevant
    assert checksum({**base, "a": base["a"].clone()}) == ref
    variants = [
        {("z" if k == "a" else k): v for k, v in base.items()},
        {**base, "a": base["a"].double()},
        {**base, "a": base["a"].reshape(100)},
        {**base, "d": base["d"] + 1},
        {k: v for k, v in base.items() if k != "b"},
    ]
    for v in variants:
        assert checksum(v) != ref


def test_checksum_of_non_contiguous_tensor_matches_its_contiguous_copy():
    t = torch.randn(4, 6).t()
    assert not t.is_contiguous()
    assert checksum({"t": t}) == checksum({"t": t.contiguous()})


def test_checksum_is_xxh3_128_and_a_bare_sha256_digest_still_verifies():
    """Publishers write xxh3-128 (10x sha256's speed on this CPU); a bucket published with
    the older format, a bare sha256 hex digest, is checked with sha256, and a digest of an
    algorithm this SDK does not know is refused with what to do."""
    import hashlib

    s = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3)}
    new = checksum(s)
    assert new.startswith("xxh3-128:") and len(new) == len("xxh3-128:") + 32
    # The older format, computed here from its definition: sha256 over name, dtype,
    # shape and the raw bytes.
    h = hashlib.sha256()
    h.update(b"w")
    h.update(b"torch.float32")
    h.update(b"(2, 3)")
    h.update(s["w"].numpy().tobytes())
    assert checksum(s, "sha256") == h.hexdigest()
    old = WeightBucket(1, 0, {"w": s["w"].clone()}, h.hexdigest())
    verify(old)
    old.tensors["w"][0, 0] = 7.0
    with pytest.raises(CorruptBucketError, match="corrupt"):
        verify(old)
    bucket = WeightBucket(1, 0, {"w": s["w"].clone()}, new)
    verify(bucket)
    bucket.tensors["w"][1, 2] += 1e-3
    with pytest.raises(CorruptBucketError, match="corrupt"):
        verify(bucket)
    foreign = WeightBucket(1, 0, s, "blake9:00ff")
    with pytest.raises(CorruptBucketError, match="unknown algorithm 'blake9'.*same one"):
        verify(foreign)
    with pytest.raises(ValueError, match="unknown checksum algorithm"):
        checksum(s, "md4")


def test_split_buckets_respects_bound_order_and_checksums():
    s = state()
    buckets = list(split_buckets(s.items(), 500, version=7))
    assert [list(b.tensors) for b in buckets] == [["a", "b"], ["c"], ["d"]]
    assert [b.index for b in buckets] == [0, 1, 2]
    assert all(b.version == 7 for b in buckets)
    for b in buckets:
        assert b.nbytes <= 500 or len(b.tensors) == 1  # an oversize tensor stands alone
        verify(b)
    with pytest.raises(ValueError, match="bucket_bytes must be positive"):
        list(split_buckets(s.items(), 0, version=1))


def test_verify_rejects_changed_bytes_as_corrupt_bucket_error():
    bucket = next(split_buckets(state().items(), 10_000, version=3))
    bucket.tensors["a"][0, 0] += 1
    with pytest.raises(CorruptBucketError, match="bucket 0 of version 3 is corrupt") as info:
        verify(bucket)
    err = info.value
    # One error, three ways to catch it: the old ValueError, the transport's, the SDK's.
    assert isinstance(err, ValueError) and isinstance(err, WeightSyncError)
    assert isinstance(err, RollartError)
    assert err.version == 3 and err.bucket == 0


def test_verify_against_manifest_entry():
    bucket = next(split_buckets(state().items(), 10_000, version=3))
    ref = bucket_ref(bucket)
    verify(bucket, ref, version=3)

    # The manifest's checksum is the authority: a rewritten bucket checksum does not help.
    forged = WeightBucket(3, 0, {k: v.clone() for k, v in bucket.tensors.items()})
    forged.tensors["d"][0] = 99
    forged.checksum = checksum(forged.tensors)
    verify(forged)  # self-consistent ...
    with pytest.raises(CorruptBucketError, match="corrupt"):
        verify(forged, ref)  # ... but not what was published

    with pytest.raises(CorruptBucketError, match="stale"):
        verify(bucket, ref, version=4)
    renamed = WeightBucket(3, 0, {("x" if k == "a" else k): v for k, v in bucket.tensors.items()},
                           bucket.checksum)
    with pytest.raises(CorruptBucketError, match=r"missing \['a'\], unexpected \['x'\]"):
        verify(renamed, ref)
    moved = WeightBucket(3, 1, bucket.tensors, bucket.checksum)
    with pytest.raises(CorruptBucketError, match="expected bucket index 0, got 1"):
        verify(moved, ref)
    with pytest.raises(CorruptBucketError, match="no checksum"):
        verify(WeightBucket(3, 0, bucket.tensors))


def test_bucket_ref_and_plan_manifest():
    s = state()
    buckets = list(split_buckets(s.items(), 500, version=2))
    bare = WeightBucket(2, 3, {"e": torch.ones(3)})
    manifest = plan_manifest(2, "nccl", [*buckets, bare], group="g0")
    assert manifest.version == 2 and manifest.transport == "nccl"
    assert manifest.meta == {"group": "g0"}
    assert [r.index for r in manifest.buckets] == [0, 1, 2, 3]
    assert all(r.handle is None for r in manifest.buckets)
    assert manifest.nbytes == sum(int(t.numel() * t.element_size()) for t in s.values()) + 12
    assert bare.checksum == checksum(bare.tensors)  # filled in when it was empty
    assert manifest.buckets[3].checksum == bare.checksum


def test_check_complete_catches_missing_duplicate_stale_and_foreign_buckets():
    buckets = list(split_buckets(state().items(), 500, version=5))
    manifest = plan_manifest(5, "ray", buckets)
    check_complete(manifest, buckets)
    check_complete(manifest, list(reversed(buckets)))  # arrival order does not matter

    with pytest.raises(WeightSyncError, match=r"1 of 3 buckets never arrived \(indices \[1\]\)"):
        check_complete(manifest, [buckets[0], buckets[2]])
    with pytest.raises(WeightSyncError, match="received twice"):
        check_complete(manifest, [*buckets, buckets[1]])
    old = list(split_buckets(state().items(), 500, version=4))
    with pytest.raises(WeightSyncError, match="carries version 4") as info:
        check_complete(manifest, [buckets[0], old[1], buckets[2]])
    assert info.value.bucket == 1 and info.value.version == 5
    extra = WeightBucket(5, 9, {"z": torch.zeros(1)})
    with pytest.raises(WeightSyncError, match=r"unexpected bucket indices \[9\]"):
        check_complete(manifest, [*buckets, extra])
    other = WeightBucket(5, 2, {"q": buckets[2].tensors["d"]}, buckets[2].checksum)
    with pytest.raises(WeightSyncError, match="names differ"):
        check_complete(manifest, [buckets[0], buckets[1], other])


def test_without_aliases_drops_a_tied_name_and_keeps_distinct_views() -> None:
    """A tied embedding (one tensor, two names) goes once, under its first name; views of
    one storage that are different tensors (another offset or shape), equal values in
    separate tensors, and objects that are not tensors all stay."""
    embed = torch.randn(6, 4)
    fused = torch.randn(4, 4)
    state = {
        "model.embed_tokens.weight": embed,
        "q": fused[:2],
        "k": fused[2:],  # same storage, other offset
        "copy": embed.clone(),  # equal values, own storage
        "lm_head.weight": embed,  # tied
        "meta": "not a tensor",
    }
    got = dict(without_aliases(state.items()))
    assert list(got) == ["model.embed_tokens.weight", "q", "k", "copy", "meta"]
    assert got["model.embed_tokens.weight"] is embed
