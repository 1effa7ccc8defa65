"""The slot-cache forward (``SlotRunner.extend``) against each architecture's own full
forward: GQA with tied embeddings, Qwen2's biases, Qwen3's per-head norms, Mistral; on
transformers' modules and on the SDK's own model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from rollart_engine_torch.runner import SlotRunner
from transformers import AutoConfig, AutoModelForCausalLM

from rollart_sdk.models import load_causal_lm

ARCHS = {
    "llama": {},
    "llama-gqa-tied": {"num_key_value_heads": 2, "tie_word_embeddings": True},
    "qwen2": {"model_type": "qwen2", "num_key_value_heads": 2},
    "qwen3": {"model_type": "qwen3", "head_dim": 16},
    "mistral": {"model_type": "mistral", "sliding_window": None},
}


def _checkpoint(tmp: Path, name: str) -> Path:
    base = {"model_type": "llama", "vocab_size": 61, "hidden_size": 32, "intermediate_size": 48,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
            "max_position_embeddings": 128, "pad_token_id": 0, "rope_theta": 5000.0,
            "rms_norm_eps": 1e-5, **ARCHS[name]}
    kind = base.pop("model_type")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(kind, **base))
    with torch.no_grad():  # norms away from 1 and biases away from 0: every term counts
        for n, p in model.named_parameters():
            if "norm" in n or n.endswith(".bias"):
                p.add_(0.3 * torch.randn_like(p))
    model.save_pretrained(tmp / name)
    return tmp / name


@pytest.mark.parametrize("implementation", ["transformers", "native"])
@pytest.mark.parametrize("name", list(ARCHS))
def test_extend_gives_each_rows_full_forward_logits(tmp_path: Path, name: str,
                                                    implementation: str) -> None:
    """Three sequences in slots 5, 1 and 3 (not the first ones, not in order): a first
    step feeds whole prompts of different lengths; the next steps feed a multi-token
    continuation (a new observation) beside one-token decodes and a new prompt. Every
    row's logits are the full forward's at its last token."""
    path = _checkpoint(tmp_path, name)
    model = load_causal_lm(path, implementation=implementation)
    runner = SlotRunner(model, num_slots=8, max_seq_len=64, device="cpu")
    g = torch.Generator().manual_seed(3)
    seqs = {5: torch.randint(1, 61, (30,), generator=g).tolist(),
            1: torch.randint(1, 61, (30,), generator=g).tolist(),
            3: torch.randint(1, 61, (30,), generator=g).tolist()}
    cached = {5: 0, 1: 0, 3: 0}
    steps = [{5: 7, 1: 3}, {5: 1, 1: 6, 3: 9}, {5: 5, 1: 1, 3: 1}, {3: 4, 5: 1}]
    with torch.no_grad():
        full = {s: model(input_ids=torch.tensor([t])).logits[0].float() for s, t in seqs.items()}
    for step in steps:
        slots = list(step)
        chunks = [seqs[s][cached[s]: cached[s] + n] for s, n in step.items()]
        got = runner.extend(slots, chunks, [cached[s] for s in slots])
        assert got is not None and got.shape == (len(slots), 61)
        for row, (s, n) in enumerate(step.items()):
            cached[s] += n
            want = full[s][cached[s] - 1]
            assert (got[row] - want).abs().max() < 1e-4, (name, step, s)
