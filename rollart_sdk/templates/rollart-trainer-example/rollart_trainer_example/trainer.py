"""Trainer ``example``: one policy-gradient step per batch on a Hugging Face causal LM.

The smallest trainer that follows ``rollart_sdk.interfaces.Trainer``: GRPO advantages
(computed here, the one place they are: ``rollart_sdk.algorithms.fill_advantages``), the
PPO-clip loss against the engine's behaviour log-probs (``rollart_sdk.algorithms``), Adam,
one process. Replace the model and the loss with yours; ``tests/test_example.py`` runs
rollart's conformance kit (``check_trainer``).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field
from transformers import AutoModelForCausalLM

from rollart_sdk.algorithms import (
    allowed_groups,
    fill_advantages,
    policy_temperature,
    policy_token_logprobs,
    ppo_clip_loss,
)
from rollart_sdk.types import TrainSample, WeightBucket
from rollart_sdk.weights import split_buckets


class ExampleOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lr: float = Field(1e-3, gt=0, description="Adam learning rate")
    clip_eps: float = Field(0.2, gt=0, description="PPO clip range")
    seed: int = Field(0, description="torch seed")


class ExampleTrainer:
    def __init__(self, model: Any, rank: int = 0, world_size: int = 1,
                 init_method: str | None = None, lr: float = 1e-3, clip_eps: float = 0.2,
                 seed: int = 0) -> None:
        if world_size != 1:
            raise ValueError("trainer example runs one rank: set roles.actor_train.workers: 1")
        torch.manual_seed(seed)
        self.model = AutoModelForCausalLM.from_pretrained(model.path, dtype=torch.float32)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=lr)
        self.clip_eps = clip_eps
        self.version = 0

    def train_step(self, batch: list[TrainSample]) -> dict[str, float]:
        fill_advantages(batch)
        self.model.train()
        self.optimizer.zero_grad()
        total = 0.0
        for s in batch:
            ids = torch.tensor([s.input_ids])
            logits = self.model(input_ids=ids).logits[0, :-1]
            # The policy the engine sampled from: its temperature and allowed ids.
            groups, allowed = allowed_groups([s.allowed_token_ids])
            n = logits.shape[0]
            logp, _ = policy_token_logprobs(
                logits, ids[0, 1:], torch.full((n,), policy_temperature(s.temperature)),
                torch.full((n,), groups[0]) if allowed else None, allowed)
            logp = logp.unsqueeze(0)
            mask = torch.tensor([s.loss_mask[1:]], dtype=torch.float32)
            old = torch.tensor([s.behaviour_logprobs[1:]], dtype=torch.float32)
            adv = torch.tensor([float(s.advantage or 0.0)])
            loss, _ = ppo_clip_loss(logp, old, adv, mask, self.clip_eps)
            (loss / len(batch)).backward()
            total += float(loss.detach()) / len(batch)
        self.optimizer.step()
        self.version += 1
        return {"loss": total}

    def export_weights(self, bucket_bytes: int) -> Iterator[WeightBucket]:
        state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        yield from split_buckets(state.items(), bucket_bytes, self.version)

    def save_checkpoint(self, path: str) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        torch.save({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                    "version": self.version, "torch_rng": torch.get_rng_state(),
                    "py_rng": random.getstate()}, Path(path) / "trainer.pt")

    def load_checkpoint(self, path: str) -> None:
        state = torch.load(Path(path) / "trainer.pt", weights_only=False)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.version = state["version"]
        torch.set_rng_state(state["torch_rng"])
        random.setstate(state["py_rng"])

    def save_pretrained(self, path: str) -> None:
        self.model.save_pretrained(path)

    def close(self) -> None:
        pass
