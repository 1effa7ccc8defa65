"""Shared helpers of the megatron-trainer tests: tiny HF checkpoints (Llama, GQA Llama,
Qwen3), toy batches with behaviour log-probs, and a shard adapter for multi-rank runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from rollart_sdk.algorithms import token_logprobs
from rollart_sdk.types import TrainSample

VOCAB = 64


def make_checkpoint(path: Path, kind: str = "gqa", tie: bool = False, seed: int = 0) -> Path:
    """A random 2-layer model saved as an HF folder. ``kind``: ``llama`` (MHA), ``gqa``
    (4 query heads over 2 KV heads) or ``qwen3`` (GQA, q/k norms, explicit head_dim).
    Rope bases as the real models' (SmolLM2 100,000, Qwen3 1,000,000), not the default
    10,000: transformers 5 keeps them in ``rope_parameters``, and a trainer that reads
    only ``config.rope_theta`` rotates every position by the default base."""
    common = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, max_position_embeddings=128, tie_word_embeddings=tie,
                  pad_token_id=0, rope_theta=1e6 if kind == "qwen3" else 1e5)
    torch.manual_seed(seed)
    if kind == "qwen3":
        from transformers import Qwen3Config, Qwen3ForCausalLM

        model: Any = Qwen3ForCausalLM(Qwen3Config(num_key_value_heads=2, head_dim=16, **common))
        # random q/k norm weights, so a wrong mapping or a missing TP reduction shows
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "norm" in name:
                    p.uniform_(0.5, 1.5)
    else:
        kv = 4 if kind == "llama" else 2
        model = LlamaForCausalLM(LlamaConfig(num_key_value_heads=kv, **common))
    model.save_pretrained(path)
    return path


def behaviour_logprobs(model: torch.nn.Module, ids: list[int]) -> list[float]:
    with torch.no_grad():
        t = torch.tensor([ids])
        lp = token_logprobs(model(input_ids=t).logits, t)[0].tolist()
    return [0.0] + lp


def make_batch(model_dir: Path, n_groups: int = 2, group_size: int = 4, seed: int = 0,
               version: int = 0) -> list[TrainSample]:
    """Two-turn trajectories of different lengths with the model's behaviour log-probs;
    reward = share of even token ids in the actions."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(seed)

    def toks(lo: int, hi: int) -> list[int]:
        n = int(torch.randint(lo, hi + 1, (1,), generator=g))
        return torch.randint(1, VOCAB, (n,), generator=g).tolist()

    batch = []
    for gi in range(n_groups):
        prompt = toks(3, 6)
        for _ in range(group_size):
            a1, obs, a2 = toks(2, 5), toks(1, 3), toks(1, 4)
            ids = prompt + a1 + obs + a2
            mask = [0] * len(prompt) + [1] * len(a1) + [0] * len(obs) + [1] * len(a2)
            lps = behaviour_logprobs(model, ids)
            batch.append(TrainSample(
                input_ids=ids, loss_mask=mask,
                behaviour_logprobs=[lp if m else 0.0 for lp, m in zip(lps, mask, strict=True)],
                token_versions=[version if m else -1 for m in mask],
                reward=sum(t % 2 == 0 for t in a1 + a2) / len(a1 + a2),
                group_id=f"g{gi}",
            ))
    return batch


class Sharded:
    """What the pipeline does with ``world_size`` trainer ranks: rank ``r`` is handed
    ``batch[r::world_size]``. Delegates everything else to the wrapped trainer."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    @property
    def version(self) -> int:
        return self.trainer.version

    def train_step(self, batch: list[TrainSample]) -> dict[str, float]:
        t = self.trainer
        return t.train_step(batch[t.rank :: t.world_size])

    def export_weights(self, bucket_bytes: int) -> Any:
        return self.trainer.export_weights(bucket_bytes)

    def save_checkpoint(self, path: str) -> None:
        self.trainer.save_checkpoint(path)

    def load_checkpoint(self, path: str) -> None:
        self.trainer.load_checkpoint(path)

    def save_pretrained(self, path: str) -> None:
        self.trainer.save_pretrained(path)
