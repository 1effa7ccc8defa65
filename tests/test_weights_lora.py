"""LoRA adapter payloads (rollart_sdk.weights.lora) as the engines that keep no base copy
of their own (vLLM, SGLang) take them: convert_buckets merges each pair against the
served checkpoint's tensors, adds the adapted modules' other tensors (fused layers reload
whole), checks names and shapes first, and names what is wrong."""

from __future__ import annotations

import pytest
import torch

from rollart_sdk.engine_adapter import checkpoint_shapes, convert_buckets
from rollart_sdk.models import load_causal_lm
from rollart_sdk.testing.trainer import tiny_llama_checkpoint
from rollart_sdk.types import WeightBucket
from rollart_sdk.weights.lora import CheckpointBase, adapter_names, split_adapter

Q = "model.layers.0.self_attn.q_proj.weight"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return tiny_llama_checkpoint(tmp_path_factory.mktemp("tiny"), tie=True)


def _pair(out_f: int, in_f: int, rank: int = 3, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rank, in_f, generator=g), torch.randn(out_f, rank, generator=g)


def test_convert_buckets_merges_adapters_against_the_checkpoint(ckpt):
    base = load_causal_lm(str(ckpt)).state_dict()
    a, b = _pair(*base[Q].shape)
    k = "model.layers.1.self_attn.k_proj.weight"
    full_k = torch.randn_like(base[k])
    names = adapter_names(Q)
    bucket = WeightBucket(1, 0, {names[0]: a, names[1]: b, k: full_k})
    got, fill = convert_buckets([bucket], checkpoint_shapes(str(ckpt)), lambda x: x.tensors,
                                CheckpointBase(str(ckpt)))
    assert sorted(got) == sorted([Q, k])
    torch.testing.assert_close(got[Q], base[Q] + b @ a, atol=1e-5, rtol=0)
    assert torch.equal(got[k], full_k)
    # then the rest of the adapted module (vLLM reloads q, k, v as one qkv_proj): the base's
    attn = "model.layers.0.self_attn."
    assert sorted(fill) == [attn + f"{x}_proj.weight" for x in "kov"]
    assert all(torch.equal(fill[n], base[n]) for n in fill)
    # a bucket boundary between A and B: the pair is merged where it completes
    split = [WeightBucket(1, 0, {names[0]: a}), WeightBucket(1, 1, {k: full_k, names[1]: b})]
    got2, fill2 = convert_buckets(split, checkpoint_shapes(str(ckpt)), lambda x: x.tensors,
                                  CheckpointBase(str(ckpt)))
    assert sorted(got2) == sorted([Q, k]) and torch.equal(got2[Q], got[Q])
    assert sorted(fill2) == sorted(fill)
    # tied embeddings: lm_head.weight is not stored; its base is the embedding
    head = CheckpointBase(str(ckpt))("lm_head.weight")
    assert torch.equal(head, base["model.embed_tokens.weight"])


def test_bad_adapter_payloads_are_named(ckpt):
    shapes, base = checkpoint_shapes(str(ckpt)), CheckpointBase(str(ckpt))
    out_f, in_f = shapes[Q][0]
    a, b = _pair(out_f, in_f)
    names = adapter_names(Q)
    cases = {
        "arrived without their partner": {names[0]: a},
        "not a matrix product": {names[0]: a, names[1]: torch.zeros(out_f, 5)},
        "the served model's weight is": {names[0]: torch.zeros(3, in_f + 1), names[1]: b},
        "not a tensor of the served checkpoint": dict(zip(
            adapter_names("model.nope.weight"), (a, b), strict=True)),
    }
    for message, tensors in cases.items():
        with pytest.raises(ValueError, match=message):
            convert_buckets([WeightBucket(1, 0, tensors)], shapes, lambda x: x, base)
    with pytest.raises(ValueError, match="LoRA adapter factor and this engine merges no"):
        convert_buckets([WeightBucket(1, 0, {names[0]: a, names[1]: b})], shapes, lambda x: x)
    full, pairs = split_adapter({names[0]: a, names[1]: b, Q: a})
    assert list(full) == [Q] and list(pairs) == [Q]
    with pytest.raises(ValueError, match="is missing"):
        split_adapter({names[1]: b})
