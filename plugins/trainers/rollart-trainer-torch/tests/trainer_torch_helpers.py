"""Shared helpers of the torch-trainer tests: a tiny Llama checkpoint and toy batches."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from rollart_sdk.algorithms import token_logprobs
from rollart_sdk.types import TrainSample

VOCAB = 64


def make_tiny_checkpoint(path: Path, tie: bool = False, seed: int = 0) -> Path:
    """A random 2-layer Llama (hidden 32, vocab 64) saved as a HF checkpoint folder."""
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=tie,
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    LlamaForCausalLM(config).save_pretrained(path)
    return path


def behaviour_logprobs(model: torch.nn.Module, ids: list[int]) -> list[float]:
    """What an engine running ``model`` reports: log p of each token given its prefix."""
    with torch.no_grad():
        t = torch.tensor([ids])
        lp = token_logprobs(model(input_ids=t).logits, t)[0].tolist()
    return [0.0] + lp


def make_batch(
    model_dir: Path, n_groups: int = 2, group_size: int = 4, seed: int = 0, version: int = 0
) -> list[TrainSample]:
    """Two-turn trajectories (prompt, action, observation, action) with behaviour
    log-probs from the model; reward = share of even token ids in the actions."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(seed)

    def toks(lo: int, hi: int) -> list[int]:
        n = int(torch.randint(lo, hi + 1, (1,), generator=g))
        return torch.randint(1, VOCAB, (n,), generator=g).tolist()

    batch = []
    for gi in range(n_groups):
        prompt = toks(3, 6)
        for _ in range(group_size):
            a1, obs, a2 = toks(2, 4), toks(1, 3), toks(1, 3)
            ids = prompt + a1 + obs + a2
            mask = [0] * len(prompt) + [1] * len(a1) + [0] * len(obs) + [1] * len(a2)
            lps = behaviour_logprobs(model, ids)
            batch.append(
                TrainSample(
                    input_ids=ids,
                    loss_mask=mask,
                    behaviour_logprobs=[lp if m else 0.0 for lp, m in zip(lps, mask, strict=True)],
                    token_versions=[version if m else -1 for m in mask],
                    reward=sum(t % 2 == 0 for t in a1 + a2) / len(a1 + a2),
                    group_id=f"g{gi}",
                )
            )
    return batch
