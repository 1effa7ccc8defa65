"""engine 'torch' passes the SDK's engine conformance kit."""

from __future__ import annotations

import pytest
from rollart_engine_torch.engine import TorchEngine

from rollart_sdk.models import load_tokenizer
from rollart_sdk.testing.engine import check_engine
from rollart_sdk.weights import split_buckets


def test_check_engine(tiny_model, reference_logits, other_weights, other_logits):
    tok = load_tokenizer(tiny_model.path)

    def update(version):
        # Several small buckets, as a transport would deliver them.
        return split_buckets(other_weights.items(), bucket_bytes=16_000, version=version)

    report = check_engine(
        lambda: TorchEngine(model=tiny_model, max_running=8, max_seq_len=1024),
        tokenizer_vocab_size=len(tok),
        reference_logits=reference_logits,
        update_buckets=update,
        updated_logits=other_logits,
        prompt_ids=tok.encode("You are on a frozen lake. Move:"),
        eos_token_ids=[tok.eos_token_id],
    )
    assert report["skipped"] == []
    assert {"update", "logprobs", "sampled_policy"} <= set(report["passed"])
    assert report["stats"]["recomputed"] >= 1


def test_check_engine_only_runs_the_named_checks(tiny_model, reference_logits):
    tok = load_tokenizer(tiny_model.path)
    started = []

    def make():
        started.append(1)
        return TorchEngine(model=tiny_model, max_running=8, max_seq_len=1024)

    with pytest.raises(ValueError, match=r"unknown checks \['sampled_polcy'\]"):
        check_engine(make, tokenizer_vocab_size=len(tok), only=("sampled_polcy",))
    assert not started  # a typo is caught before an engine starts
    report = check_engine(make, tokenizer_vocab_size=len(tok), reference_logits=reference_logits,
                          only=("sampled_policy",))
    assert report["passed"] == ["sampled_policy"]
    assert "logprobs" in report["skipped"] and "update" in report["skipped"]


def test_the_update_check_catches_weights_accepted_but_not_all_loaded(
        tiny_model, reference_logits, other_weights, other_logits):
    """An update whose version advances while part of the model keeps the old values (a
    tensor the engine skipped): the kit compares what new requests get with the loaded
    weights' teacher-forced pass and fails."""
    tok = load_tokenizer(tiny_model.path)
    partial = {k: v for k, v in other_weights.items() if ".layers.1." not in k}
    assert 0 < len(partial) < len(other_weights)
    with pytest.raises(AssertionError, match="the served weights are not the loaded ones"):
        check_engine(
            lambda: TorchEngine(model=tiny_model, max_running=8, max_seq_len=1024),
            tokenizer_vocab_size=len(tok),
            update_buckets=lambda v: split_buckets(partial.items(), 16_000, v),
            updated_logits=other_logits,
            prompt_ids=tok.encode("You are on a frozen lake. Move:"),
            eos_token_ids=[tok.eos_token_id],
            only=("update",),
        )
