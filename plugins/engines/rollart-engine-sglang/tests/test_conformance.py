"""engine 'sglang' passes the SDK's engine conformance kit.

Here it drives the recorded-contract stand-in of SGLang 0.5.23 (sglang_contract.py), not
SGLang itself: this checks the adapter's command loop, bookkeeping and the order of its
SGLang calls, not SGLang's numerics. With ROLLART_SGLANG_REAL=1 and SGLang installed, the
same test runs on the real engine.
"""

from __future__ import annotations

import os

from rollart_engine_sglang.engine import SglangEngine

from rollart_sdk.models import load_tokenizer
from rollart_sdk.testing.engine import check_engine
from rollart_sdk.weights import split_buckets


def test_check_engine(tiny_model, reference, other_weights):
    tok = load_tokenizer(tiny_model.path)

    def update(version):
        return split_buckets(other_weights.items(), bucket_bytes=16_000, version=version)

    report = check_engine(
        lambda: SglangEngine(model=tiny_model, device="cpu", context_length=1024),
        tokenizer_vocab_size=len(tok),
        reference_logprobs=reference,
        update_buckets=update,
        prompt_ids=tok.encode("You are on a frozen lake. Move:"),
        eos_token_ids=[tok.eos_token_id],
        long_tokens=200 if os.environ.get("ROLLART_SGLANG_REAL") == "1" else 120,
        timeout_s=120.0,
    )
    assert report["skipped"] == []
    assert report["stats"]["recomputed"] >= 1
