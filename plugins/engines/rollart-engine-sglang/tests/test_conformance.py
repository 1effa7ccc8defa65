"""engine 'sglang' passes the SDK's engine conformance kit.

Without ROLLART_SGLANG_REAL=1 it drives the recorded-contract stand-in of SGLang 0.5.23
(sglang_contract.py): the adapter's command loop, bookkeeping and call order, not SGLang's
numerics. With ROLLART_SGLANG_REAL=1 (ci.sh's SGLang venv) the same kit runs on the real
SGLang 0.5.23 CPU engine (torch_native attention) serving the tiny Llama.

On that CPU engine the same-seed check is skipped: SGLang 0.5.23 uses a request's
``sampling_seed`` only under ``enable_deterministic_inference``, which accepts GPU attention
backends only (not torch_native), so seeded requests are not reproducible there.
"""

from __future__ import annotations

import importlib.util
import sys

import pytest
from rollart_engine_sglang.engine import SglangEngine

from rollart_sdk.models import load_tokenizer
from rollart_sdk.testing.engine import check_engine
from rollart_sdk.weights import split_buckets

# conftest.py registers the stand-in as this module unless the real SGLang is used.
REAL_SGLANG = "rollart_sglang_contract" not in sys.modules


def test_check_engine(tiny_model, reference_logits, other_weights):
    tok = load_tokenizer(tiny_model.path)

    def update(version):
        return split_buckets(other_weights.items(), bucket_bytes=16_000, version=version)

    report = check_engine(
        lambda: SglangEngine(model=tiny_model, device="cpu", context_length=1024,
                             max_total_tokens=16384),
        tokenizer_vocab_size=len(tok),
        reference_logits=reference_logits,
        update_buckets=update,
        prompt_ids=tok.encode("You are on a frozen lake. Move:"),
        eos_token_ids=[tok.eos_token_id],
        long_tokens=200 if REAL_SGLANG else 120,
        timeout_s=120.0,
        seeded_determinism=not REAL_SGLANG,
    )
    assert report["skipped"] == ([] if not REAL_SGLANG else ["seeded_determinism"])
    assert report["stats"]["recomputed"] >= 1


@pytest.mark.skipif(not REAL_SGLANG or importlib.util.find_spec("rollart_transport_nccl") is None,
                    reason="needs the real SGLang (ci.sh part 2) and the nccl transport plugin")
def test_check_engine_with_weights_over_the_collective(tiny_model, other_weights):
    """The kit's update check with the version broadcast by the nccl transport (gloo) into
    SGLang's scheduler process: the collective path (scheduler.py)."""
    from rollart_transport_nccl.transport import NcclTransport

    from rollart_sdk.testing.transport import LoadingThrough

    tok = load_tokenizer(tiny_model.path)
    sender = NcclTransport("sender", backend="gloo", receivers=1, timeout_s=60,
                           join_timeout_s=60)
    receiver = NcclTransport("receiver", store=sender.address, receivers=1, timeout_s=60,
                             join_timeout_s=60)
    engines = []

    def make():
        engines.append(LoadingThrough(
            SglangEngine(model=tiny_model, device="cpu", context_length=1024,
                         max_total_tokens=16384), sender, receiver, "nccl"))
        return engines[-1]

    report = check_engine(
        make, tokenizer_vocab_size=len(tok),
        update_buckets=lambda v: split_buckets(other_weights.items(), 16_000, v),
        prompt_ids=tok.encode("You are on a frozen lake. Move:"),
        eos_token_ids=[tok.eos_token_id], timeout_s=120.0,
        only=("generate", "suspend_resume", "update"),
    )
    assert {"generate", "suspend_resume", "update"} <= set(report["passed"])
    (engine,) = engines
    assert engine.direct == [True] and engine.reports[0].nbytes > 0
    assert receiver._gen == -1 and sorted(sender.sent_s) == [1]  # SGLang's scheduler received
