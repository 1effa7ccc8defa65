"""Shared helpers of the torch-trainer tests: a tiny Llama checkpoint and toy batches
(the SDK's own, from ``rollart_sdk.testing.trainer``), and an engine's log-probs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from rollart_sdk.algorithms import token_logprobs
from rollart_sdk.config import ModelConfig
from rollart_sdk.testing.trainer import tiny_llama_checkpoint, toy_batch
from rollart_sdk.types import TrainSample

VOCAB = 64


def make_tiny_checkpoint(path: Path, tie: bool = False, seed: int = 0) -> Path:
    """A random 2-layer Llama (hidden 32, vocab 64) saved as a HF checkpoint folder."""
    return tiny_llama_checkpoint(path, vocab=VOCAB, tie=tie, seed=seed)


def behaviour_logprobs(model: torch.nn.Module, ids: list[int]) -> list[float]:
    """What an engine running ``model`` reports: log p of each token given its prefix."""
    with torch.no_grad():
        t = torch.tensor([ids])
        lp = token_logprobs(model(input_ids=t).logits, t)[0].tolist()
    return [0.0] + lp


def make_batch(
    model_dir: Path, n_groups: int = 2, group_size: int = 4, seed: int = 0, version: int = 0
) -> list[TrainSample]:
    """Two-turn trajectories with behaviour log-probs from the model; reward = share of
    even token ids in the actions."""
    return toy_batch(model_dir, n_groups, group_size, seed, version, vocab=VOCAB)


def make_trainer(path: Path, **options: object) -> Any:
    """A TorchTrainer on the checkpoint at ``path``: lr 1e-3, micro-batches of 3, seed 0,
    one thread, then ``options``."""
    from rollart_trainer_torch.trainer import TorchTrainer

    opts = {"lr": 1e-3, "micro_batch_size": 3, "seed": 0, "num_threads": 1, **options}
    return TorchTrainer(model=ModelConfig(path=str(path)), **opts)
